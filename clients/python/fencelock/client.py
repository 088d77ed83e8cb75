"""The :class:`Client`: connections, the retry loop and the calls.

Every call goes through one retry loop (docs/protocol.md, "Retry rules"). It
starts at the node that last answered, follows ``NOT_LEADER`` to the leader's
address (the first redirect at once, a chain of them with backoff), moves on
to the next endpoint after a backoff of 20 ms doubling to 500 ms, with
jitter, when a node is unavailable, times out, closes the connection or
cannot be reached, and gives up with :class:`~fencelock.Unavailable` once
the call's ``retry_for`` is spent. Retrying is safe: an acquire carries the
client's owner, the same on every retry, and a retried acquire by the same
owner gets the same token back, never a second grant.
"""

import getpass
import logging
import os
import random
import secrets
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

from . import client_pb2 as pb
from ._wire import Closed, Connection, TimedOut, split_endpoint
from .errors import (
    Delayed,
    FencelockError,
    Held,
    Internal,
    InvalidArgument,
    NoSession,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
    WaitTimedOut,
)
from .lock import Lock, LockContext, local_holds
from .session import Session, SessionContext
from .share import SHARE_NAMES, Share, check_share
from .watch import Observer, Watch

log = logging.getLogger("fencelock")

Key = Union[str, bytes, bytearray, memoryview]

#: The first pause after a failed attempt; it doubles up to BACKOFF_MAX.
BACKOFF_MIN = 0.020
BACKOFF_MAX = 0.500
#: The least time an attempt gets, even at the end of its call's budget.
ATTEMPT_MIN = 0.100
#: The environment variable that names the owner, when the client is not
#: given one.
OWNER_ENV = "FENCELOCK_OWNER"
#: The longest wait of one acquire request of a campaign without a wait:
#: it asks again when that runs out.
CAMPAIGN_ROUND = 30.0


def to_bytes(value: Key, what: str = "key") -> bytes:
    """A key, prefix, owner or value as bytes: str as UTF-8."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a {what} is str or bytes, not {type(value).__name__}")


def _millis(seconds: float, what: str) -> int:
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds != seconds:
        raise TypeError(f"{what} is a number of seconds, not {seconds!r}")
    if seconds < 0:
        raise InvalidArgument(f"{what} may not be negative ({seconds} s)")
    return min(int(round(seconds * 1000)), (1 << 64) - 1)


def default_owner() -> str:
    """``user@host-pid-random``: unique per call, and telling whose it is."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in the environment or passwd
        user = "user"
    host = socket.gethostname() or "host"
    return f"{user[:64]}@{host[:64]}-{os.getpid()}-{secrets.token_hex(6)}"


@dataclass(frozen=True)
class Grant:
    """A granted acquire: the fencing token, the lease the server granted
    (seconds), whether this owner held the key already (``existing``: a
    retried acquire, and the token is the one granted then), and when the
    request that got it was sent (``time.monotonic()``): the lease counts
    from then."""

    key: bytes
    token: int
    ttl: float
    existing: bool
    sent: float


@dataclass(frozen=True)
class LockInfo:
    """The holder of a key, as a node sees it. ``ttl`` is the lease of the
    last grant or renewal and ``remaining`` the time left on it by the
    answering node's clock, both in seconds (``remaining`` 0: it has run out
    and its expiry is on its way). ``delayed``: the lock expired and the key
    is held back by lock-delay: no one holds it (``token`` and ``owner`` were
    the last holder's), ``ttl`` is the delay and ``remaining`` what is left.
    ``value``: what the holder says of itself (the acquire's value, or its
    last proclaim); empty for none. ``share``: how it holds the key,
    ``"exclusive"`` (a plain lock), ``"read"`` or ``"write"`` (a read-write
    lock), ``"permit"`` (one of a semaphore's ``permits``; 0 otherwise), or
    ``"unknown"`` for a kind newer than this client. ``session``: the id of
    the session it is held under (:attr:`Session.id`), 0 for a lease of its
    own; ``ttl`` and ``remaining`` are then the session's."""

    key: bytes
    token: int
    owner: bytes
    ttl: float
    remaining: float
    delayed: bool = False
    value: bytes = b""
    share: str = "exclusive"
    permits: int = 0
    session: int = 0

    @classmethod
    def _from(cls, info: "pb.LockInfo") -> "LockInfo":
        return cls(
            info.key, info.token, info.owner, info.lease_ms / 1000.0, info.remaining_ms / 1000.0, info.delayed,
            info.value, SHARE_NAMES.get(info.share, "unknown"), info.permits, info.session,
        )


@dataclass(frozen=True)
class Member:
    id: int
    peer_addr: str
    client_addr: str
    reachable: bool
    role: str


@dataclass(frozen=True)
class NodeStatus:
    """One node's view of the cluster (docs/protocol.md, "The status
    answer"); ``raw`` is the whole protobuf answer."""

    node_id: int
    role: str
    term: int
    leader_id: int
    leader_addr: str
    commit_index: int
    applied_index: int
    locks: int
    last_token: int
    quorum: bool
    starting: bool
    rejoining: bool
    cluster_id: str
    members: List[Member] = field(default_factory=list)
    raw: Optional["pb.StatusResponse"] = field(default=None, repr=False, compare=False)

    @property
    def is_leader(self) -> bool:
        return self.role == "leader"

    @classmethod
    def _from(cls, status: "pb.StatusResponse") -> "NodeStatus":
        members = [Member(m.id, m.peer_addr, m.client_addr, m.reachable, m.role) for m in status.members]
        return cls(
            status.node_id,
            status.role,
            status.term,
            status.leader_id,
            status.leader_addr,
            status.commit_index,
            status.applied_index,
            status.locks,
            status.last_token,
            status.quorum,
            status.starting,
            status.rejoining,
            status.cluster_id,
            members,
            status,
        )


class _Outcome:
    """How one attempt (one request to one node) ended."""

    DONE, REDIRECT, RETRY = range(3)

    def __init__(self, kind: int, reason: str = "", response: Optional[pb.Response] = None,
                 leader: str = "", refused: bool = False, leader_id: int = 0):
        self.kind = kind
        self.reason = reason
        self.response = response
        self.leader = leader
        #: The leader's id a redirect named (0: not said).
        self.leader_id = leader_id
        self.refused = refused


class Client:
    """A thread-safe fencelock client.

    ``endpoints``: the client addresses of any nodes of the cluster, as
    ``"host:port"`` strings (a list, or one comma-separated string).
    ``owner``: the identity every acquire carries (str or bytes); by default
    ``$FENCELOCK_OWNER``, else a fresh ``user@host-pid-random`` per client.
    It is the same on every retry, which is what makes retries safe.
    ``request_timeout``: the longest one attempt may take (an acquire that
    waits gets its wait on top). ``retry_for``: the longest one call keeps
    retrying. ``drift``: the clock-rate error ρ allowed for when counting a
    lease (docs/leases.md). ``tls``: ``(ca_file, cert_file, key_file)`` to
    speak TLS 1.3 with a client certificate of the cluster's CA.

    Connections open on first use, so a client can be made while the
    cluster is down. :meth:`close` (or leaving a ``with Client(...)`` block)
    closes the sessions still open through it, releases the locks still
    held through it and closes its connections.
    """

    def __init__(
        self,
        endpoints: Union[str, Iterable[str]],
        *,
        owner: Optional[Key] = None,
        request_timeout: float = 5.0,
        retry_for: float = 30.0,
        drift: float = 0.01,
        tls: Optional[Tuple[str, str, str]] = None,
    ):
        if isinstance(endpoints, str):
            endpoints = endpoints.split(",")
        self.endpoints: List[str] = [e.strip() for e in endpoints if e.strip()]
        if not self.endpoints:
            raise InvalidArgument("no endpoints given")
        for endpoint in self.endpoints:
            try:
                split_endpoint(endpoint)
            except ValueError as err:
                raise InvalidArgument(str(err)) from None
        if not request_timeout > 0 or not retry_for >= 0:
            raise InvalidArgument("request_timeout must be positive and retry_for not negative")
        if not 0 <= drift < 1:
            raise InvalidArgument(f"drift is a rate error between 0 and 1, not {drift}")
        self.request_timeout = float(request_timeout)
        self.retry_for = float(retry_for)
        self.drift = float(drift)
        self._tls: Optional[ssl.SSLContext] = None
        tls_user = None
        if tls is not None:
            self._tls, tls_user = _tls_context(tls)
        if owner is None:
            owner = os.environ.get(OWNER_ENV) or None
        if owner is None:
            # Over TLS an owner belongs to the user: `user/suffix`.
            owner = f"{tls_user}/{default_owner()}" if tls_user else default_owner()
        self.owner: bytes = to_bytes(owner, "owner")
        if not self.owner:
            raise InvalidArgument("the owner is empty")
        self._connections: Dict[str, Connection] = {}
        self._pool = threading.Lock()
        self._preferred: Optional[str] = None
        self._locks: Set[Lock] = set()
        self._sessions: Set[Session] = set()
        self._random = random.Random()
        self._closed = False

    def __repr__(self) -> str:
        return f"Client(endpoints={self.endpoints!r}, owner={self.owner!r})"

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def preferred_endpoint(self) -> Optional[str]:
        """The endpoint that last answered a call: where the next starts."""
        return self._preferred

    # -- locks -------------------------------------------------------------

    def lock(self, key: Key, ttl: Optional[float] = None, wait: float = 0, value: Key = b"", *,
             on_lost: Optional[Callable[[Lock], None]] = None, session: Optional[Session] = None) -> LockContext:
        """``with client.lock(key, ttl=10, wait=0) as lock:`` acquires on
        entering (see :meth:`acquire`) and releases on leaving, best effort.
        ``with client.lock(key, session=s) as lock:`` holds it under a
        session."""
        return LockContext(lambda: self.acquire(key, ttl, wait, value, on_lost=on_lost, session=session))

    def acquire(self, key: Key, ttl: Optional[float] = None, wait: float = 0, value: Key = b"", *,
                on_lost: Optional[Callable[[Lock], None]] = None, session: Optional[Session] = None) -> Lock:
        """Acquires ``key`` for ``ttl`` seconds, waiting up to ``wait`` seconds
        in the leader's queue if another owner holds it (0: answer at once).
        The :class:`Lock` is renewed in the background until released.
        ``value`` (str or bytes, up to 4,096 bytes): what the holder says of
        itself while it holds the key, shown by :meth:`get`, :meth:`list`
        and watches; :meth:`Lock.proclaim` replaces it. A retried acquire
        keeps the value the lock has.

        Raises :class:`Held` (``wait=0``) or :class:`WaitTimedOut` when it did
        not get the lock. Within this process, a key that another Lock of
        the same owner holds is waited for (up to ``wait``) or refused the
        same way: the server would hand the same lock over (``existing``),
        and one Lock's release would end the other's.

        ``session``: a :class:`Session` (:meth:`open_session`) to hold the
        lock under instead of a lease of its own; ``ttl`` is then not
        needed (and ignored), the acquire is the session's owner's, the
        Lock is not renewed by itself (the session's keep-alive renews it)
        and it is freed when the session closes or lapses. A session that
        is not open raises :class:`NoSession`."""
        owner = self._owner_under(None, session)
        return self._acquire_lock(key, ttl, wait, owner, to_bytes(value, "value"), None, on_lost, session)

    def lock_shared(self, key: Key, share: Share, ttl: Optional[float] = None, wait: float = 0, *,
                    owner: Optional[Key] = None, on_lost: Optional[Callable[[Lock], None]] = None,
                    session: Optional[Session] = None) -> LockContext:
        """``with client.lock_shared(key, Share.READ, ttl=10) as lock:``
        acquires shared on entering (see :meth:`acquire_shared`) and
        releases on leaving, best effort."""
        share = check_share(share)
        return LockContext(lambda: self.acquire_shared(key, share, ttl, wait, owner=owner, on_lost=on_lost,
                                                       session=session))

    def acquire_shared(self, key: Key, share: Share, ttl: Optional[float] = None, wait: float = 0, *,
                       owner: Optional[Key] = None, on_lost: Optional[Callable[[Lock], None]] = None,
                       session: Optional[Session] = None) -> Lock:
        """Acquires ``key`` shared: as a reader (``Share.READ``) or the
        writer (``Share.WRITE``) of a read-write lock, or as one permit of a
        semaphore of N (``Share.permit(N)``, N fixed by the key's first
        acquire). Waits up to ``wait`` seconds, first come first served (a
        reader does not pass a waiting writer). Each holder has a token and
        a lease of its own; the :class:`Lock` is renewed and released as
        :meth:`acquire`'s is, and carries no value.

        A key of another kind raises :class:`InvalidArgument` (a semaphore
        of other permits, a read-write lock asked for a permit or the other
        way round) or :class:`Held` (a plain lock's key). As with
        :meth:`acquire`, one Lock per owner and key in a process: for two
        permits (or two readers) in one process, use two owners (``owner``,
        else the client's).

        ``session``: held under a :class:`Session` instead of a lease of its
        own, as with :meth:`acquire`; the owner is then the session's
        (``owner``, if given, must be the same)."""
        share = check_share(share)
        owner_bytes = self._owner_under(owner, session)
        return self._acquire_lock(key, ttl, wait, owner_bytes, b"", share, on_lost, session)

    def campaign(self, election: Key, value: Key, ttl: Optional[float] = None, wait: Optional[float] = None, *,
                 on_lost: Optional[Callable[[Lock], None]] = None, session: Optional[Session] = None) -> Lock:
        """Campaigns in ``election`` (a key) with ``value`` (what this
        candidate says of itself: its address, say; str or bytes, up to
        4,096 bytes): waits in the leader's FIFO queue of candidates, and
        leads once granted, with a fencing token, for as long as the
        returned :class:`Lock` is renewed. :meth:`Lock.proclaim` changes the
        value; releasing the Lock (or leaving its ``with`` block) resigns.
        Observers (:meth:`observe`) see each leader and value.

        ``wait``: None campaigns for as long as it takes; seconds otherwise,
        and then :class:`WaitTimedOut` (or :class:`Held` with 0, as
        :meth:`acquire`) when it did not lead within them. Either way it
        asks in acquire requests of at most 30 s of wait each, asking again
        when one runs out (below every server's maximum wait).

        ``session``: the candidacy (and the leadership) is held under a
        :class:`Session`, as with :meth:`acquire`: it ends when the session
        closes or lapses; ``ttl`` is then not needed."""
        deadline = None if wait is None else time.monotonic() + _millis(wait, "wait") / 1000.0
        while True:
            left = CAMPAIGN_ROUND if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return self.acquire(election, ttl, min(left, CAMPAIGN_ROUND), value, on_lost=on_lost,
                                    session=session)
            except WaitTimedOut:
                # Still another candidate's turn: ask again, the wait goes on.
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    def proclaim(self, key: Key, token: int, value: Key) -> bool:
        """The holder of ``key`` under ``token`` replaces its lock's value
        (an election's leader proclaims a new one). False: that token does
        not hold the key (any more)."""
        request = pb.Request(proclaim=pb.ProclaimRequest(
            key=to_bytes(key), token=token, value=to_bytes(value, "value")))
        return _expect(self._call_simple(request), "proclaim").proclaim.proclaimed

    def watch(self, prefix: Key, after: Optional[int] = None) -> Watch:
        """Follows the holders of the keys under ``prefix`` (a
        :class:`Watch`): without ``after``, the first :meth:`Watch.next`
        brings the current holders at once, and the next ones the changes,
        in log order; with ``after`` (a :attr:`Watch.position` seen before),
        the changes after that log index, or, if the node no longer has
        them, a ``compacted`` answer with the current holders. Any node may
        answer: a watch goes on across leader changes."""
        return Watch(self, to_bytes(prefix, "prefix"), after)

    def observe(self, election: Key) -> Observer:
        """Follows ``election`` (an :class:`Observer`): who leads now, then
        each new leader and each value it proclaims."""
        key = to_bytes(election, "election")
        return Observer(Watch(self, key), key)

    def acquire_raw(self, key: Key, ttl: Optional[float] = None, wait: float = 0, *, owner: Optional[Key] = None,
                    value: Key = b"", session: Union[Session, int, None] = None) -> Grant:
        """One acquire, retried as needed, and nothing else: no renewal, no
        release, no check against other Locks of this process. The lock
        lives until its lease runs out or it is released by token. Under
        ``owner`` if given, else the client's, with ``value`` (see
        :meth:`acquire`). ``session`` (a :class:`Session` or a session's
        id): held under that session, until it ends or the lock is released
        by token; ``ttl`` is then not needed, and the owner must be the
        session's (a :class:`Session`'s by default)."""
        owner_bytes = self._owner_under(owner, session)
        return self._acquire_grant(to_bytes(key), ttl, wait, owner_bytes, to_bytes(value, "value"), None, session)

    def acquire_shared_raw(self, key: Key, share: Share, ttl: Optional[float] = None, wait: float = 0, *,
                           owner: Optional[Key] = None, session: Union[Session, int, None] = None) -> Grant:
        """:meth:`acquire_raw` shared (see :meth:`acquire_shared`): one
        acquire, no renewal, no release."""
        share = check_share(share)
        owner_bytes = self._owner_under(owner, session)
        return self._acquire_grant(to_bytes(key), ttl, wait, owner_bytes, b"", share, session)

    # -- sessions ----------------------------------------------------------

    def open_session(self, ttl: float, owner: Optional[Key] = None, *,
                     on_lost: Optional[Callable[[Session], None]] = None, background: bool = True) -> Session:
        """Opens a session for ``owner`` (else the client's) with a time to
        live of ``ttl`` seconds (within the server's lease bounds, else
        :class:`InvalidArgument`). Locks acquired with ``session=`` are
        held under it: one keep-alive renews them all, and closing the
        session (:meth:`Session.close`) or its lapse frees them all at once.

        ``background`` (default): a daemon thread keeps it alive every third
        of its TTL until it is closed or lost; False: the caller calls
        :meth:`Session.keep_alive` within every TTL. ``on_lost(session)`` is
        called once if it is lost (see :class:`Session`).

        A session counts as one lock in its owner's quota. An open is not
        idempotent: an open retried after its answer was lost opens another
        session, and the first lapses after its TTL, holding nothing."""
        owner_bytes = self.owner if owner is None else to_bytes(owner, "owner")
        if not owner_bytes:
            raise InvalidArgument("the owner is empty")
        session_id, granted, sent = self._open_session(owner_bytes, ttl)
        session = Session(self, session_id, granted, owner_bytes, sent, on_lost, background)
        with self._pool:
            self._sessions.add(session)
        session._start()
        return session

    def session(self, ttl: float, owner: Optional[Key] = None, *,
                on_lost: Optional[Callable[[Session], None]] = None, background: bool = True) -> SessionContext:
        """``with client.session(ttl=10) as session:`` opens a session on
        entering (see :meth:`open_session`) and closes it on leaving, best
        effort: everything held under it is released at once."""
        return SessionContext(lambda: self.open_session(ttl, owner, on_lost=on_lost, background=background))

    def _acquire_grant(self, key_bytes: bytes, ttl: Optional[float], wait: float, owner_bytes: bytes,
                       value_bytes: bytes, share: Optional[Share], session: Union[Session, int, None] = None) -> Grant:
        """One acquire, retried as needed: plain (``share`` None) or shared,
        with a lease of its own or under ``session``."""
        if isinstance(session, Session):
            session_id, session_ttl_ms = session.id, _millis(session.ttl, "ttl")
        elif session is None:
            session_id, session_ttl_ms = 0, 0
        elif isinstance(session, int) and not isinstance(session, bool) and 0 < session < 1 << 64:
            session_id, session_ttl_ms = session, 0
        else:
            raise TypeError(f"session is a Session or a session's id, not {session!r}")
        if session_id:
            # Under a session the lease is the session's: none is sent.
            lease_ms = 0
        elif ttl is None:
            raise TypeError("ttl (seconds) is needed unless the acquire is under a session")
        else:
            lease_ms = _millis(ttl, "ttl")
        # A plain acquire leaves the fields at their defaults (EXCLUSIVE, 0):
        # on the wire it is what it was before they existed.
        share_pb, permits = share._to_pb() if share is not None else (pb.EXCLUSIVE, 0)
        wait_until = time.monotonic() + _millis(wait, "wait") / 1000.0
        timeout = self.request_timeout

        def make() -> Tuple[pb.Request, float]:
            # A retry (after a leader change, say) waits only for what is
            # left of the caller's wait.
            wait_left = max(0.0, wait_until - time.monotonic())
            request = pb.Request(acquire=pb.AcquireRequest(
                key=key_bytes, lease_ms=lease_ms, owner=owner_bytes, wait_ms=_millis(wait_left, "wait"),
                value=value_bytes, share=share_pb, permits=permits, session=session_id))
            return request, wait_left + timeout

        try:
            response, sent, _ = self._call(make, self.retry_for + wait)
        except NoSession as err:
            if isinstance(session, Session):
                session._gone(f"session {session.id} is not open any more: {err}")
            raise
        answer = _expect(response, "acquire").acquire
        holder = answer.holder_token or None
        if answer.outcome == pb.GRANTED:
            if answer.token == 0:
                raise Internal("granted without a token")
            granted_ms = answer.lease_ms or lease_ms or session_ttl_ms
            return Grant(key_bytes, answer.token, granted_ms / 1000.0, answer.existing, sent)
        if answer.outcome == pb.HELD and answer.delayed:
            raise Delayed(holder, answer.delay_left_ms / 1000.0)
        if answer.outcome == pb.HELD:
            raise Held(holder)
        if answer.outcome == pb.WAIT_TIMED_OUT:
            raise WaitTimedOut(holder)
        raise Internal("an acquire answered without an outcome")

    def release(self, key: Key, token: int) -> bool:
        """Releases ``key`` if ``token`` holds it. False: it did not (any
        more); a retried release whose first attempt worked says False too."""
        return self._release(to_bytes(key), token, False, self.retry_for)

    def force_release(self, key: Key) -> bool:
        """Releases ``key`` whoever holds it (needs the ``force`` right over
        TLS). False: it was free."""
        return self._release(to_bytes(key), 0, True, self.retry_for)

    def renew(self, key: Key, token: int, ttl: float) -> bool:
        """Renews ``key`` held under ``token`` to ``ttl`` seconds from now.
        False: that token no longer holds the key; the lock is lost."""
        renewed, _, _, _ = self._renew(to_bytes(key), token, ttl, self.retry_for)
        return renewed

    def get(self, key: Key, linearizable: bool = True) -> Optional[LockInfo]:
        """Who holds ``key``, or None when it is free; of a read-write lock
        or a semaphore, its first holder by token (:meth:`holders` tells
        every one). Linearizable reads ask the leader; others take the
        answering node's (maybe stale) table."""
        answer = self._get(key, linearizable)
        return LockInfo._from(answer.holder) if answer.HasField("holder") else None

    def holders(self, key: Key, linearizable: bool = True) -> List[LockInfo]:
        """Every holder of ``key``, by token: a read-write lock's readers
        or its writer, a semaphore's permits, or a plain lock's one holder;
        empty when the key is free. Reads as :meth:`get`."""
        answer = self._get(key, linearizable)
        if answer.holders:
            return [LockInfo._from(info) for info in answer.holders]
        return [LockInfo._from(answer.holder)] if answer.HasField("holder") else []

    def check(self, key: Key, token: int) -> bool:
        """Whether ``token`` holds ``key`` now (linearizable)."""
        request = pb.Request(check=pb.CheckRequest(key=to_bytes(key), token=token))
        return _expect(self._call_simple(request), "check").check.holds

    def list(self, prefix: Key = "", limit: int = 0) -> List[LockInfo]:
        """Up to ``limit`` locks whose keys start with ``prefix``, in key
        order (linearizable), one per holder (a read-write lock's readers,
        a semaphore's permits); ``limit`` 0 means the server's maximum."""
        request = pb.Request(list=pb.ListRequest(prefix=to_bytes(prefix, "prefix"), limit=limit))
        return [LockInfo._from(info) for info in _expect(self._call_simple(request), "list").list.locks]

    def status(self, endpoint: str) -> NodeStatus:
        """Asks the node at ``endpoint`` (in the endpoints or not) about
        itself: one attempt, no retries elsewhere."""
        if self._closed:
            raise FencelockError("the client is closed")
        outcome = self._attempt(endpoint, pb.Request(status=pb.StatusRequest()), self.request_timeout)
        if outcome.kind != _Outcome.DONE:
            raise Unavailable(outcome.reason)
        assert outcome.response is not None
        return NodeStatus._from(_expect(outcome.response, "status").status)

    def close(self) -> None:
        """Closes every Session still open through this client, releases
        every Lock still held through it (best effort, one request timeout
        each) and closes the connections."""
        with self._pool:
            sessions = list(self._sessions)
        for session in sessions:
            session._close_quietly()
        with self._pool:
            locks = list(self._locks)
        for lock in locks:
            lock._release_quietly()
        self._closed = True
        with self._pool:
            connections = list(self._connections.values())
            self._connections.clear()
        for connection in connections:
            connection.close()

    # -- internals ---------------------------------------------------------

    def _acquire_lock(self, key: Key, ttl: Optional[float], wait: float, owner: bytes, value: bytes,
                      share: Optional[Share], on_lost: Optional[Callable[[Lock], None]],
                      session: Optional[Session] = None) -> Lock:
        """An acquire and its :class:`Lock`: one per owner and key in this
        process, handed over with a lease it can count on (or held under
        ``session``)."""
        if session is not None and not isinstance(session, Session):
            raise TypeError(f"session is a Session (Client.open_session), not {session!r}")
        key_bytes = to_bytes(key)
        started = time.monotonic()
        hold = local_holds.take(owner, key_bytes, wait)
        try:
            grant = self._acquire_grant(key_bytes, ttl, max(0.0, wait - (time.monotonic() - started)), owner,
                                        value, share, session)
            if session is None:
                grant = self._fresh_start(grant)
            hold.granted(grant.token)
            lock = Lock(self, key, key_bytes, grant, hold, on_lost, share, session)
        except BaseException:
            hold.free()
            raise
        with self._pool:
            self._locks.add(lock)
        if session is not None:
            session._add(lock)
        lock._start()
        return lock

    def _owner_under(self, owner: Optional[Key], session: Union[Session, int, None]) -> bytes:
        """The owner of an acquire: ``owner``, else a :class:`Session`'s,
        else the client's. An acquire under a session must be its owner's."""
        owner_bytes = None if owner is None else to_bytes(owner, "owner")
        if isinstance(session, Session):
            if owner_bytes is not None and owner_bytes != session.owner:
                raise InvalidArgument(
                    f"an acquire under session {session.id} is its owner's ({session.owner!r}), not {owner_bytes!r}")
            return session.owner
        return self.owner if owner_bytes is None else owner_bytes

    def _open_session(self, owner: bytes, ttl: float) -> Tuple[int, float, float]:
        """Opens a session: its id, TTL (seconds) and the send time of the
        attempt that opened it."""
        ttl_ms = _millis(ttl, "ttl")
        request = pb.Request(session_open=pb.SessionOpenRequest(owner=owner, ttl_ms=ttl_ms))
        response, sent, _ = self._call(lambda: (request, self.request_timeout), self.retry_for)
        answer = _expect(response, "session").session
        if not answer.found or answer.session == 0:
            raise Internal("a session open answered without a session")
        return answer.session, (answer.ttl_ms or ttl_ms) / 1000.0, sent

    def _keep_alive_session(self, session_id: int, budget: float) -> Tuple[bool, float, float]:
        """One keep-alive, retried within ``budget``: whether the session
        is open, the send time of the attempt that got the answer, and the
        TTL (seconds)."""
        request = pb.Request(session_keep_alive=pb.SessionKeepAliveRequest(session=session_id))
        response, sent, _ = self._call(lambda: (request, self.request_timeout), budget)
        answer = _expect(response, "session").session
        return answer.found, sent, answer.ttl_ms / 1000.0

    def _close_session(self, session_id: int, budget: float) -> bool:
        request = pb.Request(session_close=pb.SessionCloseRequest(session=session_id))
        response, _, _ = self._call(lambda: (request, self.request_timeout), budget)
        return _expect(response, "session").session.found

    def _forget_session(self, session: Session) -> None:
        with self._pool:
            self._sessions.discard(session)

    def _get(self, key: Key, linearizable: bool) -> "pb.GetResponse":
        request = pb.Request(get=pb.GetRequest(key=to_bytes(key), linearizable=linearizable))
        return _expect(self._call_simple(request), "get").get

    def _fresh_start(self, grant: Grant) -> Grant:
        """A grant whose lease, counted from its send time, is half gone or
        more (an acquire that waited in the leader's queue: the server's
        lease starts when it grants, but all the client can prove is the
        send time) is renewed at once, so that the Lock starts with a lease
        it can count on. Raises :class:`Unavailable` if the lease ran out
        before the renewal."""
        usable = grant.ttl * (1 - self.drift) / (1 + self.drift)
        if time.monotonic() - grant.sent < usable / 2:
            return grant
        renewed, sent, lease, _ = self._renew(grant.key, grant.token, grant.ttl, self.retry_for)
        if not renewed:
            raise Unavailable(
                f"{grant.key!r} was granted under token {grant.token} after a wait, but its lease ran out"
                " before it could be renewed")
        return Grant(grant.key, grant.token, lease, grant.existing, sent)

    def _forget_lock(self, lock: Lock) -> None:
        with self._pool:
            self._locks.discard(lock)

    def _release(self, key: bytes, token: int, force: bool, budget: float) -> bool:
        request = pb.Request(release=pb.ReleaseRequest(key=key, token=token, force=force))
        response, _, _ = self._call(lambda: (request, self.request_timeout), budget)
        return _expect(response, "release").release.released

    def _renew(self, key: bytes, token: int, ttl: float, budget: float) -> Tuple[bool, float, float, int]:
        """One renewal, retried within ``budget``: whether it was renewed,
        when the attempt that got the answer was sent, the lease granted
        (seconds), and the holder's token when it was not renewed."""
        lease_ms = _millis(ttl, "ttl")
        request = pb.Request(renew=pb.RenewRequest(locks=[pb.LockRef(key=key, token=token)], lease_ms=lease_ms))
        response, sent, _ = self._call(lambda: (request, self.request_timeout), budget)
        answer = _expect(response, "renew").renew
        for result in answer.results:
            if result.key == key and result.token == token:
                return result.renewed, sent, (answer.lease_ms or lease_ms) / 1000.0, result.holder_token
        raise Internal("a renewal answered without the lock it renewed")

    def _call_simple(self, request: pb.Request) -> pb.Response:
        return self._call(lambda: (request, self.request_timeout), self.retry_for)[0]

    def _call(self, make: Callable[[], Tuple[pb.Request, float]], budget: float) -> Tuple[pb.Response, float, str]:
        """The retry loop. ``make`` builds each attempt's request and its
        timeout; ``budget`` bounds the whole call. Returns the answer, when
        the attempt that got it was sent, and the endpoint that answered."""
        started = time.monotonic()
        deadline = started + budget
        target = self._preferred or self.endpoints[0]
        # Where "the next endpoint" goes on from; a leader outside the list
        # goes on from the top.
        index = self.endpoints.index(target) if target in self.endpoints else len(self.endpoints) - 1
        backoff = BACKOFF_MIN
        redirected = False
        attempted = False
        last_reason = "no node answered in time"
        refused: Set[str] = set()
        # The node a redirect named: under TLS only its certificate passes.
        expect: Optional[int] = None
        while True:
            if self._closed:
                raise FencelockError("the client is closed")
            sent = time.monotonic()
            left = deadline - sent
            # Every call makes one attempt at least, even when a busy
            # machine ate its budget before it started.
            if left <= 0 and attempted:
                raise Unavailable(f"no node could serve the request within {budget:.1f} s; last: {last_reason}")
            attempted = True
            request, attempt_timeout = make()
            outcome = self._attempt(target, request, min(attempt_timeout, max(left, ATTEMPT_MIN)), expect)
            if outcome.kind == _Outcome.DONE:
                self._preferred = target
                assert outcome.response is not None
                return outcome.response, sent, target
            last_reason = outcome.reason
            if outcome.kind == _Outcome.REDIRECT and outcome.leader != target:
                target = outcome.leader
                expect = outcome.leader_id or None
                # The first redirect is followed at once; a chain of them
                # (stale views during an election) backs off.
                pause = redirected
                redirected = True
            else:
                if outcome.refused:
                    refused.add(target)
                    if refused.issuperset(self.endpoints):
                        raise InvalidArgument(f"every endpoint refused this client's connection; last: {last_reason}")
                index = (index + 1) % len(self.endpoints)
                target = self.endpoints[index]
                expect = None
                pause = True
            if pause:
                # Jitter: clients that failed together do not retry together.
                sleep = self._random.uniform(backoff / 2, backoff)
                time.sleep(max(0.0, min(sleep, deadline - time.monotonic())))
                backoff = min(backoff * 2, BACKOFF_MAX)

    def _attempt(self, endpoint: str, request: pb.Request, timeout: float, expect: Optional[int] = None) -> _Outcome:
        """One request to one node, connecting first if needed. With
        ``expect`` (a redirect named that node), under TLS the request goes
        only if the node's certificate names it: a follower's hint is only
        as good as what its peers said."""
        started = time.monotonic()
        try:
            connection = self._connection(endpoint, timeout)
            if expect is not None and self._tls is not None and connection.node != expect:
                named = "no node" if connection.node is None else f"node {connection.node}"
                return _Outcome(
                    _Outcome.RETRY,
                    f"{endpoint}: its certificate names {named}, not node {expect}, whom the redirect named:"
                    " not followed")
            response = connection.call(request, max(0.0, timeout - (time.monotonic() - started)))
        except TimedOut:
            return _Outcome(_Outcome.RETRY, f"{endpoint}: no answer within {timeout:.2f} s")
        except Closed as err:
            return _Outcome(_Outcome.RETRY, f"{endpoint}: {err.reason}", refused=err.refused)
        return _classify(endpoint, response)

    def _connection(self, endpoint: str, timeout: float) -> Connection:
        with self._pool:
            connection = self._connections.get(endpoint)
        if connection is not None and not connection.closed:
            return connection
        # Connecting happens outside the pool's lock, so that a slow node
        # does not hold up calls to the others.
        fresh = Connection(endpoint, timeout, self._tls)
        with self._pool:
            current = self._connections.get(endpoint)
            if current is not None and not current.closed:
                keep, spare = current, fresh
            else:
                self._connections[endpoint] = keep = fresh
                spare = None
        if spare is not None:
            spare.close()
        return keep


def _classify(endpoint: str, response: pb.Response) -> _Outcome:
    if response.HasField("error") and response.error.code != pb.OK:
        error = response.error
        reason = f"{endpoint}: {pb.ErrorCode.Name(error.code) if error.code in pb.ErrorCode.values() else error.code}"
        if error.message:
            reason += f": {error.message}"
        if error.code == pb.NOT_LEADER and error.leader_addr:
            return _Outcome(_Outcome.REDIRECT, reason, leader=error.leader_addr, leader_id=error.leader_id)
        if error.code in (pb.NOT_LEADER, pb.TIMEOUT, pb.UNAVAILABLE):
            return _Outcome(_Outcome.RETRY, reason)
        if error.code == pb.INVALID_ARGUMENT:
            raise InvalidArgument(error.message)
        if error.code == pb.PERMISSION_DENIED:
            raise PermissionDenied(error.message)
        if error.code == pb.RESOURCE_EXHAUSTED:
            raise ResourceExhausted(error.message)
        if error.code == pb.NO_SESSION:
            raise NoSession(error.message)
        # INTERNAL, or a code newer than this client.
        raise Internal(reason)
    if response.WhichOneof("kind") is None:
        raise Internal(f"{endpoint}: answered without a result")
    return _Outcome(_Outcome.DONE, response=response)


def _expect(response: pb.Response, kind: str) -> pb.Response:
    got = response.WhichOneof("kind")
    if got != kind:
        raise Internal(f"a {kind} request was answered with a {got} response")
    return response


def _tls_context(tls: Sequence[str]) -> Tuple[ssl.SSLContext, Optional[str]]:
    """The TLS 1.3 context for ``(ca_file, cert_file, key_file)``, and the
    user the certificate names (its ``fencelock://user/NAME`` URI)."""
    try:
        ca_file, cert_file, key_file = tls
    except (TypeError, ValueError):
        raise InvalidArgument("tls is (ca_file, cert_file, key_file)") from None
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_verify_locations(cafile=ca_file)
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as err:
        raise InvalidArgument(f"TLS: {err}") from None
    return context, _certificate_user(cert_file)


def _certificate_user(cert_file: str) -> Optional[str]:
    """The user a client certificate names, or None if it cannot be read
    (then the owner names no user, and the server may refuse it)."""
    prefix = "fencelock://user/"
    try:
        # CPython's own decoder; it has no public name but has been there
        # since 3.3.
        decoded = ssl._ssl._test_decode_cert(cert_file)  # type: ignore[attr-defined]
    except Exception:
        return None
    for kind, value in decoded.get("subjectAltName", ()):
        if kind == "URI" and value.startswith(prefix):
            return value[len(prefix):]
    return None


__all__ = ["Client", "Grant", "LockInfo", "Member", "NodeStatus", "FencelockError", "Session", "default_owner"]
