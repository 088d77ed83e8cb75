"""Locks against a real 3-node cluster that stays whole (the shared one)."""

import threading
import time

import pytest

import fencelock
from fencelock import Held, InvalidArgument, Unavailable, WaitTimedOut
from harness import DroppingProxy, wait_until


def test_acquire_get_check_list_release(cluster):
    client = cluster.client()
    other = cluster.client()
    with client.lock("basic/a", ttl=10) as lock:
        assert lock.key == "basic/a" and lock.token > 0 and not lock.is_lost()
        assert 9.0 < lock.time_left() <= 10.0
        info = client.get("basic/a")
        assert info is not None
        assert (info.key, info.token, info.owner, info.ttl) == (b"basic/a", lock.token, client.owner, 10.0)
        assert 0 < info.remaining <= 10.0
        # Any client may read; keys may be given as bytes.
        assert other.get(b"basic/a").token == lock.token
        assert other.check("basic/a", lock.token) is True
        assert other.check("basic/a", lock.token + 1) is False
        raw = client.acquire_raw(b"basic/b\xff", ttl=10)
        listed = other.list("basic/")
        assert [(i.key, i.token) for i in listed] == [(b"basic/a", lock.token), (b"basic/b\xff", raw.token)]
        assert [i.key for i in other.list("basic/", limit=1)] == [b"basic/a"]
        assert other.list("basic/none") == []
        # A release by the wrong token changes nothing.
        assert other.release(b"basic/b\xff", raw.token + 1) is False
        assert client.release(b"basic/b\xff", raw.token) is True
        assert client.release(b"basic/b\xff", raw.token) is False
    # Leaving the block released it.
    assert other.get("basic/a") is None
    assert other.check("basic/a", lock.token) is False
    assert lock.release() is False


def test_a_lock_held_by_another_owner_is_refused_or_waited_for(cluster):
    first, second = cluster.client(), cluster.client()
    lock = first.acquire("conflict/k", ttl=10)
    with pytest.raises(Held) as held:
        second.acquire("conflict/k", ttl=10)
    assert held.value.holder_token == lock.token
    started = time.monotonic()
    with pytest.raises(WaitTimedOut) as timed_out:
        second.acquire("conflict/k", ttl=10, wait=0.5)
    assert timed_out.value.holder_token == lock.token
    assert 0.45 <= time.monotonic() - started < 3.0
    # A waiter is handed the lock when the holder releases it.
    got = []
    waiter = threading.Thread(target=lambda: got.append(second.acquire("conflict/k", ttl=10, wait=10)))
    waiter.start()
    time.sleep(0.3)
    assert not got, "the waiter got a lock that was held"
    assert lock.release() is True
    waiter.join(10)
    assert got and got[0].token > lock.token
    assert second.get("conflict/k").owner == second.owner
    got[0].release()


def test_an_acquire_retried_by_its_owner_gets_the_same_token(cluster):
    # The server's rule: the owner that holds a key is answered with its own
    # token (existing), whichever connection or client asks.
    owner = f"retry-owner-{time.time_ns()}"
    one, two = cluster.client(owner=owner), cluster.client(owner=owner)
    grant = one.acquire_raw("retry/plain", ttl=10)
    again = two.acquire_raw("retry/plain", ttl=10)
    assert (again.token, again.existing, grant.existing) == (grant.token, True, False)
    with pytest.raises(Held) as held:
        cluster.client().acquire_raw("retry/plain", ttl=10)
    assert held.value.holder_token == grant.token
    assert one.release("retry/plain", grant.token)

    # The client's own retry: the first answer is lost on the way (the proxy
    # swallows it and closes the connection); the retry on the next endpoint
    # carries the same owner and gets the same grant back, not a second one.
    leader = cluster.leader()
    proxy = DroppingProxy(leader.client_addr)
    try:
        client = fencelock.Client([proxy.addr] + cluster.endpoints, retry_for=15)
        cluster.clients.append(client)
        with client.lock("retry/lost-answer", ttl=10) as lock:
            assert proxy.dropped is not None, "the proxy saw no acquire answer"
            assert proxy.dropped.acquire.outcome == fencelock.client_pb2.GRANTED
            assert lock.token == proxy.dropped.acquire.token
            assert lock.existing is True
            assert client.preferred_endpoint != proxy.addr
            info = client.get("retry/lost-answer")
            assert (info.token, info.owner) == (lock.token, client.owner)
        assert client.get("retry/lost-answer") is None
    finally:
        proxy.close()


def test_tokens_strictly_increase(cluster):
    clients = [cluster.client(), cluster.client()]
    tokens = []
    for round_ in range(8):
        client = clients[round_ % 2]
        key = f"tokens/{round_ % 3}"
        with client.lock(key, ttl=5) as lock:
            tokens.append(lock.token)
    assert all(a < b for a, b in zip(tokens, tokens[1:])), tokens
    # A key granted again (after a release) gets a new, higher token.
    grant = clients[0].acquire_raw("tokens/0", ttl=5)
    assert grant.token > tokens[-1]
    clients[0].release("tokens/0", grant.token)


def test_renewal_keeps_a_short_lease_alive(cluster):
    client, other = cluster.client(), cluster.client()
    ttl = 2.0
    lock = client.acquire("renew/kept", ttl=ttl)
    # Nothing renews a raw grant: it shows what the lease alone would do.
    raw = client.acquire_raw("renew/unrenewed", ttl=ttl)
    assert lock.time_left() <= ttl * (1 - client.drift) / (1 + client.drift)
    left = []
    deadline = time.monotonic() + 3.5 * ttl
    while time.monotonic() < deadline:
        left.append(lock.time_left())
        time.sleep(0.1)
    assert client.get("renew/unrenewed") is None, "an unrenewed lease did not expire"
    assert not lock.is_lost(), lock.lost_reason
    assert min(left) > 0, "the lease was about to run out between renewals"
    assert lock.renewals >= 5, lock.renewals
    info = other.get("renew/kept")
    assert info is not None and info.token == lock.token
    with pytest.raises(Held):
        other.acquire("renew/kept", ttl=ttl)
    assert lock.release() is True
    assert other.check("renew/unrenewed", raw.token) is False


def test_a_force_released_lock_is_reported_lost(cluster):
    client, admin = cluster.client(), cluster.client()
    called = []
    lock = client.acquire("lost/forced", ttl=3, on_lost=called.append)
    assert admin.force_release("lost/forced") is True
    # The next renewal (every third of the ttl) is refused.
    assert lock.lost.wait(3.0), "the loss was not noticed"
    assert lock.is_lost() and lock.time_left() == 0.0
    assert "renewal refused" in lock.lost_reason and str(lock.token) in lock.lost_reason
    assert called == [lock]
    # Another owner can take the key at once; the lost lock stays lost.
    taken = admin.acquire_raw("lost/forced", ttl=3)
    assert taken.token > lock.token
    time.sleep(1.2)
    assert called == [lock] and lock.is_lost()
    assert lock.release() is False
    assert admin.get("lost/forced").token == taken.token


def test_one_process_never_shares_a_lock_between_two_locks_of_one_owner(cluster):
    owner = f"same-owner-{time.time_ns()}"
    client = cluster.client(owner=owner)
    twin = cluster.client(owner=owner)  # another client, the same owner
    with client.lock("local/k", ttl=10) as first:
        for acquirer in (client, twin):
            with pytest.raises(Held) as held:
                acquirer.acquire("local/k", ttl=10)
            assert held.value.holder_token == first.token
        started = time.monotonic()
        with pytest.raises(WaitTimedOut):
            twin.acquire("local/k", ttl=10, wait=0.3)
        assert time.monotonic() - started >= 0.25
        # A waiter of the same owner gets the key once the first lets go.
        got = []
        waiter = threading.Thread(target=lambda: got.append(twin.acquire("local/k", ttl=10, wait=10)))
        waiter.start()
        time.sleep(0.3)
        assert not got, "a second Lock of the owner shared the lock"
        assert client.check("local/k", first.token)
    waiter.join(10)
    assert got, "the waiter did not get the key"
    second = got[0]
    assert second.token > first.token and not second.existing
    assert not client.check("local/k", first.token) and client.check("local/k", second.token)
    second.release()
    # Another key, or another owner, is not held back.
    with client.lock("local/k", ttl=10), client.lock("local/other", ttl=10):
        pass


def test_leaving_the_block_by_an_exception_releases(cluster):
    client = cluster.client()
    with pytest.raises(RuntimeError):
        with client.lock("exc/k", ttl=10) as lock:
            raise RuntimeError("the job failed")
    assert client.get("exc/k") is None
    assert lock.release() is False


def test_errors_are_typed(cluster):
    client = cluster.client()
    with pytest.raises(InvalidArgument):
        client.acquire("errors/short", ttl=0.5)  # below --lease-min-ms (2 s)
    with pytest.raises(InvalidArgument):
        client.acquire("", ttl=5)
    with pytest.raises(InvalidArgument):
        client.acquire("x" * 2000, ttl=5)
    with pytest.raises(InvalidArgument):
        client.acquire("errors/neg", ttl=-1)
    with pytest.raises(TypeError):
        client.get(42)
    with pytest.raises(InvalidArgument):
        fencelock.Client([])
    with pytest.raises(InvalidArgument):
        fencelock.Client(["no-port"])
    assert issubclass(Held, fencelock.FencelockError) and issubclass(Unavailable, fencelock.FencelockError)
    # A failed acquire leaves nothing behind in this process.
    with client.lock("errors/short", ttl=5):
        pass


def test_status_and_the_leader(cluster):
    client = cluster.client()
    statuses = [client.status(endpoint) for endpoint in cluster.endpoints]
    leaders = [s for s in statuses if s.is_leader]
    assert len(leaders) == 1 and leaders[0].quorum
    leader = leaders[0]
    assert sorted(s.node_id for s in statuses) == [1, 2, 3]
    for status in statuses:
        assert status.leader_id == leader.node_id
        assert status.leader_addr == cluster.nodes[leader.node_id].client_addr
        assert [m.id for m in status.members] == [1, 2, 3]
    with pytest.raises(Unavailable):
        client.status("127.0.0.1:1")
    # Every call ends at the leader: followers point the client there.
    client.get("status/k")
    assert client.preferred_endpoint == cluster.nodes[leader.node_id].client_addr


def test_the_owner_defaults_to_the_environment_or_a_unique_name(cluster, monkeypatch):
    monkeypatch.delenv("FENCELOCK_OWNER", raising=False)
    a, b = fencelock.Client(cluster.endpoints), fencelock.Client(cluster.endpoints)
    assert a.owner != b.owner and b"@" in a.owner
    monkeypatch.setenv("FENCELOCK_OWNER", "env-owner")
    assert fencelock.Client(cluster.endpoints).owner == b"env-owner"
    assert fencelock.Client(cluster.endpoints, owner="given").owner == b"given"


def test_a_cluster_that_does_not_answer_is_given_up_after_retry_for():
    client = fencelock.Client(["127.0.0.1:1", "127.0.0.1:2"], retry_for=1.0, request_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(Unavailable) as unavailable:
        client.get("k")
    elapsed = time.monotonic() - started
    assert 0.95 <= elapsed < 2.5, elapsed
    assert "cannot connect" in str(unavailable.value)


def test_waiting_is_bounded_by_the_callers_wait(cluster):
    client, other = cluster.client(), cluster.client()
    with client.lock("wait/k", ttl=10):
        assert wait_until(lambda: other.get("wait/k") is not None, 2)
        started = time.monotonic()
        with pytest.raises(WaitTimedOut):
            with other.lock("wait/k", ttl=10, wait=1.0):
                pass
        assert 0.9 <= time.monotonic() - started < 4.0
