"""FencedRegister: the resource's side of fencing."""

import random
import threading

import pytest

from fencelock import FencedRegister, StaleToken


def test_a_holder_whose_lease_ran_out_is_turned_away(cluster):
    register = FencedRegister()
    slow, fast = cluster.client(), cluster.client()
    # The slow holder gets the lock, writes, then "pauses" past its lease;
    # here its lock is taken from it instead of waiting the lease out.
    first = slow.acquire_raw("fenced/row", ttl=5)
    register.check_and_set("row", first.token, "slow 1")
    assert fast.force_release("fenced/row")
    with fast.lock("fenced/row", ttl=5) as second:
        assert second.token > first.token
        register.check_and_set("row", second.token, "fast 1")
        # The slow holder wakes up and writes with its old token.
        with pytest.raises(StaleToken) as stale:
            register.check_and_set("row", first.token, "slow 2")
        assert (stale.value.token, stale.value.highest) == (first.token, second.token)
        assert register.get("row") == (second.token, "fast 1")
        # The holder may write again under its own token.
        register.check_and_set("row", second.token, "fast 2")
    assert register.get("row") == (second.token, "fast 2")
    assert register.highest("other") is None and register.get("other") is None


def test_the_register_keeps_the_highest_token_under_concurrent_writers():
    register = FencedRegister()
    accepted = {}
    refused = {}
    tokens = list(range(1, 2001))
    random.Random(7).shuffle(tokens)

    def writer(part):
        for token in part:
            resource = token % 3
            try:
                register.check_and_set(resource, token, token)
                accepted[token] = True
            except StaleToken as err:
                assert err.highest > token
                refused[token] = True

    threads = [threading.Thread(target=writer, args=(tokens[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(accepted) + len(refused) == len(tokens)
    for resource in range(3):
        top = max(t for t in tokens if t % 3 == resource)
        assert register.highest(resource) == top
        assert register.get(resource) == (top, top)
    # A refused write changes nothing.
    with pytest.raises(StaleToken):
        register.check_and_set(0, 1, "stale")
    assert register.get(0)[1] != "stale"
    with pytest.raises(TypeError):
        register.check_and_set(0, -1)
