"""Nodes killed under a client: each test has a cluster of its own."""

import signal
import time

import pytest

import fencelock
from fencelock import Held, Unavailable
from harness import wait_until


def test_a_client_follows_the_new_leader_after_a_leader_kill(new_cluster):
    cluster = new_cluster()
    client = cluster.client(retry_for=20)
    other = cluster.client(retry_for=20)
    ttl = 3.0
    held = client.acquire("failover/held", ttl=ttl)
    before = [held.token, client.acquire_raw("failover/before", ttl=ttl).token]
    old = cluster.leader()
    # The client's calls end at the leader, so its next call goes there first.
    assert client.preferred_endpoint == old.client_addr
    renewals_before = held.renewals
    old.kill(signal.SIGKILL)
    killed = time.monotonic()

    # A new acquire goes through: the dead leader, then a follower that
    # names the new leader (or no leader yet, and a backoff), then there.
    fresh = client.acquire("failover/new", ttl=ttl)
    took = time.monotonic() - killed
    assert fresh.token > max(before), (fresh.token, before)
    new = cluster.leader(exclude=old.id)
    assert client.preferred_endpoint == new.client_addr
    assert took < 15, took

    # The lock held across the fail-over: the new leader kept its deadline
    # (docs/leases.md), so a renewal made in time keeps it; if none was,
    # the client says it is lost instead of counting on it.
    deadline = killed + 2 * ttl
    while time.monotonic() < deadline and not held.is_lost():
        time.sleep(0.1)
    if held.is_lost():
        assert held.lost_reason and held.time_left() == 0.0
        print("the held lock was reported lost:", held.lost_reason)
    else:
        assert held.renewals > renewals_before, "not renewed since the kill, yet not lost"
        info = other.get("failover/held")
        assert info is not None and info.token == held.token and info.remaining > 0
        with pytest.raises(Held) as refused:
            other.acquire("failover/held", ttl=ttl)
        assert refused.value.holder_token == held.token
        assert held.time_left() > 0
        assert held.release() is True
    # Tokens go on increasing under the new leader.
    later = other.acquire_raw("failover/later", ttl=ttl)
    assert later.token > fresh.token
    fresh.release()


def test_a_lock_is_reported_lost_when_the_cluster_loses_its_quorum(new_cluster):
    cluster = new_cluster()
    client = cluster.client(retry_for=10, request_timeout=1.0)
    ttl = 2.0
    called = []
    lock = client.acquire("quorum/held", ttl=ttl, on_lost=lambda lost: called.append((lost, time.monotonic())))
    # It is renewed while the cluster is whole.
    time.sleep(ttl * 0.8)
    assert not lock.is_lost() and lock.renewals >= 1, lock.lost_reason
    leader = cluster.leader()
    follower = next(node for node in cluster.nodes.values() if node.id != leader.id)
    measured = time.monotonic()
    left = lock.time_left()
    assert left > 0, lock.lost_reason
    leader.kill(signal.SIGKILL)
    follower.kill(signal.SIGKILL)
    killed = time.monotonic()
    # No renewal can succeed now: the lease runs out on the client's clock,
    # at most a ttl after the kill, and the lock is reported lost then, not
    # before the end of the lease it had before the kill.
    assert lock.lost.wait(ttl + 1.5), "the lock outlived its lease without a quorum"
    assert len(called) == 1 and called[0][0] is lock
    lost_at = called[0][1]
    assert measured + left <= lost_at <= killed + ttl + 1.0, (measured + left - killed, lost_at - killed)
    assert "ran out" in lock.lost_reason
    assert lock.time_left() == 0.0 and lock.is_lost()
    # Calls give up after retry_for, with the reason.
    impatient = cluster.client(retry_for=1.0, request_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(Unavailable):
        impatient.check("quorum/held", lock.token)
    assert time.monotonic() - started < 3.0
    # Leaving the lock releases nothing (it is lost) and does not wait.
    started = time.monotonic()
    assert lock.release() is False
    assert time.monotonic() - started < 0.5


def test_a_key_held_back_by_lock_delay_is_refused_with_the_time_left_then_granted(new_cluster):
    from fencelock import Delayed

    cluster = new_cluster(size=1, extra_args=["--lock-delay", "held/=2s"])
    client = cluster.client(retry_for=20)
    first = client.acquire_raw("held/a", ttl=2)
    # Not renewed: the lease runs out and the key is held back, not freed.
    assert wait_until(lambda: (client.get("held/a") or fencelock.LockInfo(b"", 0, b"", 0, 0)).delayed, 10)
    info = client.get("held/a")
    assert (info.token, info.ttl, info.delayed) == (first.token, 2.0, True)
    assert client.check("held/a", first.token) is False
    with pytest.raises(Delayed) as refused:
        client.acquire_raw("held/a", ttl=2)
    assert refused.value.holder_token == first.token and 0 < refused.value.left <= 2.0
    assert isinstance(refused.value, Held)
    # A waiting acquire gets the key once the delay is over, under a greater token.
    after = client.acquire_raw("held/a", ttl=2, wait=10)
    assert after.token > first.token
    assert client.get("held/a").delayed is False
