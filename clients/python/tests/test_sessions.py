"""Sessions: one keep-alive for many locks, all freed at once when the
session closes or lapses. Against the shared real cluster (its lease bounds
are fencelockd's defaults: 2 s at least, so the short TTLs here are 2 s),
and a few wire details against scripted fake nodes."""

import threading
import time
import uuid
from typing import Any, Callable, List, Optional

import pytest

import fencelock
from fencelock import (
    Held,
    InvalidArgument,
    NoSession,
    PermissionDenied,
    Session,
    Share,
)
from fencelock import client_pb2 as pb
from harness import FakeNode, wait_until

#: The shortest TTL the test clusters allow (fencelockd's --lease-min
#: default).
SHORT_TTL = 2


def _name(what: str) -> str:
    """A key prefix of this test's own on the shared cluster."""
    return f"session-{what}-{uuid.uuid4().hex[:8]}/"


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


# -- against the real cluster --------------------------------------------------


def test_open_keep_alive_and_close(cluster):
    client = cluster.client()
    session = client.open_session(10, background=False)
    assert isinstance(session, Session)
    assert session.id > 0 and session.ttl == 10.0 and session.owner == client.owner
    assert not session.is_lost() and not session.closed
    assert 9.0 < session.time_left() <= 10.0
    assert session.keep_alive() is True and session.keep_alives == 1
    # Ids are tokens of the one counter: a later session's is greater.
    later = client.open_session(10, owner="session-other-owner", background=False)
    assert later.id > session.id and later.owner == b"session-other-owner"
    assert session.close() is True
    assert session.closed and not session.lost.is_set() and session.time_left() == 0.0
    # The server says the closed session is not open; the Session sends
    # nothing more.
    assert client._keep_alive_session(session.id, 5.0)[0] is False
    assert client._close_session(session.id, 5.0) is False
    assert session.keep_alive() is False
    assert session.close() is False
    with later:
        assert later.keep_alive() is True
    assert later.closed and client._keep_alive_session(later.id, 5.0)[0] is False
    # A TTL outside the server's lease bounds.
    with pytest.raises(InvalidArgument):
        client.open_session(0.5)


def test_a_lock_under_a_session_is_held_while_keep_alives_run_past_its_ttl(cluster):
    prefix = _name("held")
    client, other = cluster.client(), cluster.client()
    session = client.open_session(SHORT_TTL, background=False)
    lock = client.acquire(prefix + "a", session=session)
    reader = client.acquire_shared(prefix + "b", Share.READ, session=session)
    assert lock.session is session and reader.session is session
    assert lock.ttl == SHORT_TTL and lock.token > session.id and reader.token > lock.token
    assert {lock, reader} == set(session.locks)
    # 2.5 TTLs of keep-alives by hand: the locks have no renewal of their
    # own, and the session keeps them.
    started = time.monotonic()
    while time.monotonic() - started < 2.5 * SHORT_TTL:
        assert session.keep_alive() is True
        time.sleep(0.4)
    assert other.check(prefix + "a", lock.token) is True
    assert other.check(prefix + "b", reader.token) is True
    assert lock.renewals == 0 and reader.renewals == 0
    assert not lock.is_lost() and 0 < lock.time_left() <= SHORT_TTL
    with pytest.raises(Held):
        other.acquire(prefix + "a", ttl=10)
    # Releasing one lock leaves the session and the other lock as they are.
    assert lock.release() is True
    assert other.get(prefix + "a") is None and session.locks == [reader]
    assert session.keep_alive() is True
    assert other.check(prefix + "b", reader.token) is True
    assert session.close() is True
    assert other.holders(prefix + "b") == []


def test_closing_a_session_frees_all_its_locks_at_once(cluster):
    prefix = _name("close")
    client, other, waiting = cluster.client(), cluster.client(), cluster.client()
    session = client.open_session(10)
    plain = client.acquire(prefix + "plain", session=session, value="mine")
    writer = client.acquire_shared(prefix + "rw", Share.WRITE, session=session)
    permit = client.acquire_shared(prefix + "sem", Share.permit(1), session=session)
    tokens = [plain.token, writer.token, permit.token]
    waiter = _Background(lambda: waiting.acquire(prefix + "plain", ttl=10, wait=15))
    time.sleep(0.3)
    assert not waiter.done.is_set(), "the waiter got a lock that was held"
    with pytest.raises(Held):
        other.acquire_shared(prefix + "sem", Share.permit(1), ttl=10)

    assert session.close() is True
    # The waiter is handed the lock, and every other key is free at once.
    got = waiter.get(10)
    assert got.token > max(tokens)
    assert other.holders(prefix + "rw") == [] and other.holders(prefix + "sem") == []
    reader = other.acquire_shared(prefix + "rw", Share.READ, ttl=10)
    second = other.acquire_shared(prefix + "sem", Share.permit(1), ttl=10)
    assert min(reader.token, second.token) > max(tokens)
    # The Locks were released with the session, not lost.
    for lock in (plain, writer, permit):
        assert not lock.is_lost() and lock.release() is False
    assert session.locks == []
    for lock in (got, reader, second):
        lock.release()


def test_a_lapsed_session_frees_everything_and_the_next_tokens_are_greater(cluster):
    prefix = _name("lapse")
    client, other = cluster.client(), cluster.client()
    lost: List[Any] = []
    session = client.open_session(SHORT_TTL, background=False, on_lost=lost.append)
    a = client.acquire(prefix + "a", session=session, on_lost=lost.append)
    b = client.acquire_shared(prefix + "b", Share.permit(2), session=session)
    opened = time.monotonic()
    # No keep-alive: the leader lets the session lapse after its TTL.
    assert wait_until(lambda: other.get(prefix + "a") is None and other.holders(prefix + "b") == [], 15)
    assert time.monotonic() - opened > SHORT_TTL * 0.9
    assert client._keep_alive_session(session.id, 5.0)[0] is False
    # Locally: lost once its TTL ran out, and its locks with it.
    assert session.keep_alive() is False and session.is_lost()
    assert "ran out" in session.lost_reason
    assert a.is_lost() and b.is_lost() and a.time_left() == 0.0
    assert lost == [a, session], "each on_lost is called once, the locks' first"
    # The keys are free, and tokens go on from where they were.
    newer_a = other.acquire(prefix + "a", ttl=10)
    newer_b = other.acquire_shared(prefix + "b", Share.permit(2), ttl=10)
    assert newer_a.token > max(a.token, b.token) and newer_b.token > newer_a.token
    with pytest.raises(NoSession):
        client.acquire(prefix + "c", session=session)
    assert session.close() is False
    newer_a.release()
    newer_b.release()


def test_a_keep_alive_that_finds_the_session_gone_loses_it(cluster):
    prefix = _name("gone")
    client, other = cluster.client(), cluster.client()
    lost: List[Session] = []
    session = client.open_session(10, on_lost=lost.append)
    lock = client.acquire(prefix + "a", session=session)
    # Closed behind the Session's back (as by another process that knew
    # its id): the next keep-alive finds it gone.
    assert other._close_session(session.id, 5.0) is True
    assert other.get(prefix + "a") is None
    assert session.keep_alive() is False
    assert session.lost.is_set() and "not open" in session.lost_reason
    assert lost == [session]
    assert lock.is_lost() and "was lost" in lock.lost_reason
    assert lock.release() is False


def test_an_acquire_under_a_closed_session_raises_no_session(cluster):
    prefix = _name("closed")
    client = cluster.client()
    session = client.open_session(10)
    assert session.close() is True
    with pytest.raises(NoSession, match=str(session.id)):
        client.acquire(prefix + "a", session=session)
    with pytest.raises(NoSession):
        with client.lock(prefix + "a", session=session):
            pass
    with pytest.raises(NoSession):
        client.acquire_shared(prefix + "b", Share.READ, session=session)
    with pytest.raises(NoSession):
        client.acquire_raw(prefix + "c", session=session.id)
    with pytest.raises(NoSession):
        client.campaign(prefix + "election", "me", session=session, wait=0)
    # NoSession is a FencelockError; nothing was granted.
    assert issubclass(NoSession, fencelock.FencelockError)
    assert client.list(prefix) == []
    # A session that never was.
    with pytest.raises(NoSession):
        client.acquire_raw(prefix + "d", session=1)


def test_an_acquire_under_a_session_is_its_owners(cluster):
    prefix = _name("owner")
    client = cluster.client()
    with client.session(10, owner="session-owner-1") as session:
        lock = client.acquire(prefix + "a", session=session)
        assert client.get(prefix + "a").owner == b"session-owner-1"
        # Another owner under it: refused by the server...
        with pytest.raises(PermissionDenied):
            client.acquire_raw(prefix + "b", session=session.id, owner="someone-else")
        # ...and by the client before sending, given the Session.
        with pytest.raises(InvalidArgument):
            client.acquire_shared(prefix + "c", Share.READ, owner="someone-else", session=session)
        # Without a session a ttl is needed.
        with pytest.raises(TypeError):
            client.acquire(prefix + "d")
        with pytest.raises(TypeError):
            client.acquire(prefix + "d", session=session.id)
        assert lock in session.locks
    assert client.get(prefix + "a") is None


def test_lock_info_shows_the_session(cluster):
    prefix = _name("info")
    client, other = cluster.client(), cluster.client()
    with client.session(10) as session:
        lock = client.acquire(prefix + "a", session=session, value="v")
        permit = client.acquire_shared(prefix + "b", Share.permit(3), session=session)
        own = client.acquire(prefix + "c", ttl=10)
        info = other.get(prefix + "a")
        assert (info.token, info.owner, info.value, info.ttl) == (lock.token, client.owner, b"v", 10.0)
        assert 0 < info.remaining <= 10.0
        holders = other.holders(prefix + "b")
        listed = {i.key: i for i in other.list(prefix)}
        assert [h.token for h in holders] == [permit.token]
        assert other.get(prefix + "c").session == 0 and listed[(prefix + "c").encode()].session == 0
        seen = [info.session, holders[0].session, listed[(prefix + "a").encode()].session,
                listed[(prefix + "b").encode()].session]
        assert seen == [session.id] * 4
        own.release()


def test_the_background_keep_alive_keeps_a_session_alive_over_several_ttls(cluster):
    prefix = _name("background")
    client, other = cluster.client(), cluster.client()
    with client.session(SHORT_TTL) as session:
        lock = client.acquire(prefix + "a", session=session)
        time.sleep(3.5 * SHORT_TTL)
        assert other.check(prefix + "a", lock.token) is True
        # Every third of the TTL: about 10 in 3.5 TTLs.
        assert session.keep_alives >= 6
        assert not session.is_lost() and not lock.is_lost()
        assert session.time_left() > SHORT_TTL / 3
        info = other.get(prefix + "a")
        assert info.ttl == SHORT_TTL and info.remaining > 0
    # Leaving the block closed it: the thread stopped, the lock is free.
    assert session.closed and not session.lost.is_set()
    assert other.get(prefix + "a") is None
    count = session.keep_alives
    time.sleep(SHORT_TTL / 2)
    assert session.keep_alives == count


def test_a_campaign_under_a_session_leads_until_the_session_closes(cluster):
    election = _name("election") + "leader"
    one, two = cluster.client(), cluster.client()
    session = one.open_session(10)
    leader = one.campaign(election, "one:1", session=session)
    assert leader.session is session
    assert two.get(election).value == b"one:1"
    follower = _Background(lambda: two.campaign(election, "two:1", ttl=10))
    time.sleep(0.3)
    assert not follower.done.is_set()
    session.close()
    second = follower.get(10)
    assert second.token > leader.token and two.get(election).value == b"two:1"
    second.release()


def test_closing_the_client_closes_its_sessions(cluster):
    prefix = _name("client-close")
    client, other = cluster.client(), cluster.client()
    session = client.open_session(10)
    client.acquire(prefix + "a", session=session)
    client.close()
    assert session.closed
    assert other.get(prefix + "a") is None
    assert other._keep_alive_session(session.id, 5.0)[0] is False


# -- the wire, against fake nodes ------------------------------------------------


def _session_node(keep_alive_found: bool = True, acquire_error: int = pb.OK) -> FakeNode:
    def handler(request):
        kind = request.WhichOneof("kind")
        if kind == "session_open":
            return pb.Response(session=pb.SessionResponse(session=77, ttl_ms=request.session_open.ttl_ms,
                                                          found=True))
        if kind == "session_keep_alive":
            return pb.Response(session=pb.SessionResponse(session=77, ttl_ms=3000, found=keep_alive_found))
        if kind == "session_close":
            return pb.Response(session=pb.SessionResponse(session=77, found=True))
        if kind == "acquire":
            if acquire_error != pb.OK:
                return pb.Response(error=pb.Error(code=acquire_error, message="session 77 is not open"))
            return pb.Response(acquire=pb.AcquireResponse(outcome=pb.GRANTED, token=78, lease_ms=3000))
        if kind == "release":
            return pb.Response(release=pb.ReleaseResponse(released=True, token=78))
        return pb.Response(error=pb.Error(code=pb.INTERNAL, message=f"unexpected {kind}"))

    return FakeNode(handler)


def test_an_acquire_under_a_session_sends_its_id_and_no_lease():
    node = _session_node()
    client = fencelock.Client([node.addr], owner=b"me/1")
    session = client.open_session(3, background=False)
    assert (session.id, session.ttl) == (77, 3.0)
    opened = node.requests[0].session_open
    assert (opened.owner, opened.ttl_ms) == (b"me/1", 3000)
    lock = client.acquire("k", session=session, wait=1)
    sent = node.requests[1].acquire
    assert (sent.key, sent.owner, sent.session, sent.lease_ms) == (b"k", b"me/1", 77, 0)
    assert 0 < sent.wait_ms <= 1000
    assert (lock.token, lock.ttl) == (78, 3.0)
    # No renewal of its own, however long it is held.
    time.sleep(1.2)
    assert [r.WhichOneof("kind") for r in node.requests] == ["session_open", "acquire"]
    assert session.keep_alive() is True
    assert node.requests[2].session_keep_alive.session == 77
    # A ttl given beside a session is not sent.
    client.acquire_raw("k2", ttl=9, session=session)
    assert node.requests[3].acquire.lease_ms == 0 and node.requests[3].acquire.session == 77
    assert session.close() is True
    assert node.requests[-1].session_close.session == 77
    assert lock.release() is False and not lock.is_lost()
    client.close()
    node.close()


def test_no_session_is_raised_and_loses_the_session():
    node = _session_node(acquire_error=pb.NO_SESSION)
    client = fencelock.Client([node.addr], retry_for=5)
    lost: List[Session] = []
    session = client.open_session(3, background=False, on_lost=lost.append)
    started = time.monotonic()
    with pytest.raises(NoSession, match="not open"):
        client.acquire("k", session=session)
    assert time.monotonic() - started < 1.0, "NO_SESSION was retried"
    assert session.lost.is_set() and lost == [session]
    assert session.keep_alive() is False
    client.close()
    node.close()


def test_the_background_keep_alive_loses_a_session_found_gone():
    node = _session_node(keep_alive_found=False)
    client = fencelock.Client([node.addr])
    lost = threading.Event()
    session = client.open_session(0.3, on_lost=lambda s: lost.set())
    lock = client.acquire("k", session=session)
    # The first keep-alive, after a third of the TTL, finds it gone.
    assert lost.wait(2)
    assert "not open" in session.lost_reason and lock.is_lost()
    keep_alives = [r for r in node.requests if r.WhichOneof("kind") == "session_keep_alive"]
    time.sleep(0.3)
    assert len([r for r in node.requests if r.WhichOneof("kind") == "session_keep_alive"]) == len(keep_alives)
    client.close()
    node.close()
