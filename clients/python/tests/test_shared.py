"""Read-write locks and semaphores against the shared real cluster."""

import threading
import time
import uuid
from typing import Any, Callable, Optional

import pytest

from fencelock import Held, InvalidArgument, Share, WaitTimedOut
from harness import wait_until


def _name(what: str) -> str:
    """A key prefix of this test's own on the shared cluster."""
    return f"{what}-{uuid.uuid4().hex[:8]}/"


class _Background:
    """A call on a thread of its own: its result, or what it raised."""

    def __init__(self, call: Callable[[], Any]):
        self.result: Optional[Any] = None
        self.error: Optional[BaseException] = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.result = call()
            except BaseException as err:  # handed to the test
                self.error = err
            finally:
                self.done.set()

        threading.Thread(target=run, daemon=True).start()

    def get(self, timeout: float) -> Any:
        assert self.done.wait(timeout), "the call did not return"
        if self.error is not None:
            raise self.error
        return self.result


def test_two_readers_hold_at_once_and_a_writer_waits_for_both(cluster):
    key = _name("rw") + "k"
    one, two, writing, late = (cluster.client() for _ in range(4))
    first = one.acquire_shared(key, Share.READ, ttl=10)
    second = two.acquire_shared(key, Share.READ, ttl=10)
    assert first.share == Share.READ and second.token > first.token
    assert [(h.token, h.owner, h.share, h.permits) for h in writing.holders(key)] == [
        (first.token, one.owner, "read", 0), (second.token, two.owner, "read", 0)]
    assert writing.get(key).token == first.token
    with pytest.raises(Held) as held:
        writing.acquire_shared(key, Share.WRITE, ttl=10)
    assert held.value.holder_token in (first.token, second.token)
    with pytest.raises(InvalidArgument, match="read-write lock"):
        writing.acquire_shared(key, Share.permit(2), ttl=10)

    writer = _Background(lambda: writing.acquire_shared(key, Share.WRITE, ttl=10, wait=10))
    time.sleep(0.3)
    # A reader that comes after the waiting writer does not pass it.
    reader = _Background(lambda: late.acquire_shared(key, Share.READ, ttl=10, wait=10))
    time.sleep(0.3)
    assert first.release() is True
    time.sleep(0.3)
    assert not writer.done.is_set() and not reader.done.is_set()
    assert [h.token for h in one.holders(key)] == [second.token]
    assert second.release() is True
    write = writer.get(5)
    assert write.token > second.token and write.share == Share.WRITE
    assert [(h.token, h.share) for h in one.holders(key)] == [(write.token, "write")]
    assert not reader.done.is_set()
    assert write.release() is True
    read = reader.get(5)
    assert read.token > write.token
    assert [(h.token, h.share) for h in one.holders(key)] == [(read.token, "read")]
    read.release()
    assert one.holders(key) == []


def test_a_semaphore_of_two_grants_two_permits_and_no_third(cluster):
    prefix = _name("sem")
    key = prefix + "jobs"
    a, b, c = (cluster.client() for _ in range(3))
    held_a = a.acquire_shared(key, Share.permit(2), ttl=10)
    grant_b = b.acquire_shared_raw(key, Share.permit(2), ttl=10)
    assert grant_b.token > held_a.token
    with pytest.raises(Held) as held:
        c.acquire_shared(key, Share.permit(2), ttl=10)
    assert held.value.holder_token in (held_a.token, grant_b.token)
    started = time.monotonic()
    with pytest.raises(WaitTimedOut):
        c.acquire_shared(key, Share.permit(2), ttl=10, wait=0.5)
    assert time.monotonic() - started >= 0.45
    # The key is a semaphore of 2, and nothing else.
    with pytest.raises(InvalidArgument, match="semaphore of 2 permits"):
        c.acquire_shared(key, Share.permit(3), ttl=10)
    with pytest.raises(InvalidArgument, match="semaphore of 2 permits"):
        c.acquire_shared(key, Share.READ, ttl=10)
    with pytest.raises(Held):
        c.acquire(key, ttl=10)
    expected = [(held_a.token, a.owner, "permit", 2), (grant_b.token, b.owner, "permit", 2)]
    assert [(h.token, h.owner, h.share, h.permits) for h in c.holders(key)] == expected
    assert [(i.token, i.owner, i.share, i.permits) for i in c.list(prefix)] == expected
    # A retry by a holder gets its own permit back, not a second one.
    again = b.acquire_shared_raw(key, Share.permit(2), ttl=10)
    assert (again.token, again.existing) == (grant_b.token, True)
    assert b.release(key, grant_b.token) is True
    with c.lock_shared(key, Share.permit(2), ttl=10) as third:
        assert third.token > grant_b.token
        assert [h.token for h in a.holders(key)] == [held_a.token, third.token]
    assert held_a.release() is True
    assert a.holders(key) == [] and a.get(key) is None


def test_a_reader_left_unrenewed_expires_and_a_renewed_one_stays(cluster):
    key = _name("expiry") + "k"
    client, other = cluster.client(), cluster.client()
    kept = client.acquire_shared(key, Share.READ, ttl=2)  # the server's shortest lease
    # Nothing renews a raw grant; another owner, so that both hold.
    raw = client.acquire_shared_raw(key, Share.READ, ttl=2, owner=client.owner + b"/raw")
    assert [h.token for h in other.holders(key)] == [kept.token, raw.token]
    assert wait_until(lambda: [h.token for h in other.holders(key)] == [kept.token], 6.0), \
        "the unrenewed reader did not expire"
    assert other.check(key, raw.token) is False and other.check(key, kept.token) is True
    assert not kept.is_lost() and kept.renewals >= 1, kept.lost_reason
    assert kept.release() is True


def test_holders_of_a_plain_lock_and_of_a_free_key(cluster):
    key = _name("plain") + "k"
    client = cluster.client()
    assert client.holders(key) == []
    with client.lock(key, ttl=10, value="v") as lock:
        holders = client.holders(key)
        assert [(h.token, h.share, h.permits, h.value) for h in holders] == [(lock.token, "exclusive", 0, b"v")]
        assert lock.share is None
        with pytest.raises(Held):
            cluster.client().acquire_shared(key, Share.READ, ttl=10)


def test_a_shared_holders_proclaim_raises_invalid_argument_and_changes_nothing(cluster):
    prefix = _name("proclaim")
    rw, pool, plain = prefix + "rw", prefix + "pool", prefix + "leader"
    one, two = cluster.client(), cluster.client()
    readers = [client.acquire_shared(rw, Share.READ, ttl=10) for client in (one, two)]
    permits = [client.acquire_shared(pool, Share.permit(2), ttl=10) for client in (one, two)]

    def holders(key):
        return [(h.token, h.owner, h.share, h.permits, h.value) for h in one.holders(key)]

    before = holders(rw), holders(pool)
    # Each holder, the first or not, hears that it has no value to
    # proclaim, not that it lost the key (``proclaim`` False).
    for lock in readers + permits:
        with pytest.raises(InvalidArgument, match="carries no value to proclaim"):
            lock.proclaim("10.0.0.1:80")
    with pytest.raises(InvalidArgument, match=f"token {readers[1].token} holds it"):
        one.proclaim(rw, readers[1].token, "x")
    # A token that holds no place on the key: False, as before.
    assert one.proclaim(rw, permits[0].token, "x") is False
    assert (holders(rw), holders(pool)) == before
    assert all(one.check(lock.key_bytes, lock.token) for lock in readers + permits)
    # A plain lock's holder still proclaims.
    with one.lock(plain, ttl=10, value="a") as leader:
        assert leader.proclaim("b") is True
        assert one.get(plain).value == b"b"
    for lock in readers + permits:
        assert lock.release() is True
