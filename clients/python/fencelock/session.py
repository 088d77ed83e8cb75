"""Sessions: :class:`Session`, one keep-alive for many locks.

A session (docs/protocol.md, "Sessions") is opened for an owner with a time
to live (``ttl``, within the server's lease bounds). Locks, readers,
writers, permits and election candidacies can be held under it instead of
a lease of their own (the ``session=`` argument of :meth:`Client.acquire`,
:meth:`Client.lock`, :meth:`Client.acquire_shared`,
:meth:`Client.lock_shared` and :meth:`Client.campaign`): they live as long
as the session, which one keep-alive renews for all of them. When the
session ends, closed or lapsed (no keep-alive within its TTL, by the
leader's clock), everything held under it is freed at once, in one log
entry; a lock granted under a session still has a fencing token of its own.

How long a client may count on a session is counted as for a lock's lease
(docs/leases.md): from the send time of the open or of the last keep-alive
that succeeded, ``ttl × (1 − ρ) / (1 + ρ)``. A daemon thread keeps the
session alive every third of its TTL (unless opened with
``background=False``: then the caller calls :meth:`Session.keep_alive`).
The session is lost, and :attr:`Session.lost` set, when a keep-alive finds
it gone (it lapsed, or someone closed it) or when that time runs out before
a keep-alive succeeded; every :class:`~fencelock.Lock` held under it is
lost with it. A lost session is not kept alive again.
"""

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, List, Optional, Set

from .errors import FencelockError, InvalidArgument, PermissionDenied

if TYPE_CHECKING:
    from .client import Client
    from .lock import Lock

log = logging.getLogger("fencelock")

#: The shortest pause between keep-alive attempts, so that a tiny TTL
#: cannot make the keep-alive thread spin.
ROUND_MIN = 0.010


class Session:
    """A session opened by :meth:`Client.open_session` (or
    :meth:`Client.session`).

    ``id`` (the session's id, a token of the cluster's fencing-token
    counter, never issued twice), ``ttl`` (its time to live, seconds: each
    keep-alive renews it for this long), ``owner`` (bytes: every acquire
    under it is this owner's), ``keep_alives`` (how many succeeded),
    ``lost`` (a :class:`threading.Event`), ``lost_reason``, ``closed``.

    ``on_lost(session)``, if given, is called once when the session is
    lost, on the thread that notices (the keep-alive thread, or one calling
    :meth:`keep_alive`, :meth:`is_lost` or :meth:`time_left`); what it
    raises is logged. The locks held under it are lost too (their own
    ``on_lost`` is called first).

    Leaving a ``with`` block of it closes it (best effort): everything held
    under it is released at once.
    """

    def __init__(
        self,
        client: "Client",
        session_id: int,
        ttl: float,
        owner: bytes,
        sent: float,
        on_lost: Optional[Callable[["Session"], None]] = None,
        background: bool = True,
    ):
        self.id: int = session_id
        self.ttl: float = ttl
        self.owner: bytes = owner
        self.lost = threading.Event()
        self.lost_reason: Optional[str] = None
        self.keep_alives = 0
        self._client = client
        self._on_lost = on_lost
        self._state = threading.Lock()
        self._stopped = threading.Event()
        self._closed = False
        self._locks: Set["Lock"] = set()
        self._valid_until = sent + self._safe(ttl)
        self._renew_at = sent + self._round()
        self._thread: Optional[threading.Thread] = None
        if background:
            self._thread = threading.Thread(target=self._run, name=f"fencelock-session-{self.id}", daemon=True)

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else "closed" if self._closed else "open"
        return f"Session(id={self.id}, ttl={self.ttl}, owner={self.owner!r}, {state})"

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_quietly()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called (or the client was closed)."""
        return self._closed

    @property
    def locks(self) -> List["Lock"]:
        """The :class:`~fencelock.Lock` objects held under this session
        through this process and not released."""
        with self._state:
            return list(self._locks)

    def time_left(self) -> float:
        """The seconds the client may still count on the session (and on
        every lock held under it): from the send time of the open or the
        last successful keep-alive, the TTL less the drift margin, less the
        time since. 0 once lost or closed, never negative."""
        if self.lost.is_set() or self._closed:
            return 0.0
        with self._state:
            left = self._valid_until - time.monotonic()
        if left <= 0:
            self._lose("the session's TTL ran out before a keep-alive succeeded")
            return 0.0
        return left

    def is_lost(self) -> bool:
        """True once the session is lost: a keep-alive found it gone, or
        its TTL ran out without one. Check it before acting on its locks."""
        self.time_left()
        return self.lost.is_set()

    def keep_alive(self) -> bool:
        """Renews the session now, for another TTL from this request's send
        time, and with it everything held under it. True: it is still open.
        False: it is not (it lapsed, or was closed: everything it held is
        free), and it is lost from now on; or it was lost or closed already
        (then nothing is sent). Raises :class:`~fencelock.Unavailable` when
        no node answered within the client's ``retry_for``."""
        if self._closed or self.is_lost():
            return False
        return self._keep_alive(self._client.retry_for)

    def close(self) -> bool:
        """Stops the keep-alives and closes the session: everything held
        under it is released at once, in one log entry (no lock-delay).
        True: it was open and is now closed. False: it was not open any
        more (it lapsed, or was closed already; a retried close whose first
        attempt worked says False too)."""
        with self._state:
            if self._closed:
                return False
            self._closed = True
        self._stopped.set()
        try:
            return self._client._close_session(self.id, self._client.retry_for)
        finally:
            self._done()

    # -- internals ---------------------------------------------------------

    def _close_quietly(self) -> None:
        """As :meth:`close`, within one request timeout, never raising: a
        session left open lapses after its TTL anyway."""
        with self._state:
            if self._closed:
                return
            self._closed = True
        self._stopped.set()
        try:
            self._client._close_session(self.id, self._client.request_timeout)
        except FencelockError as err:
            log.warning("fencelock: closing session %d failed: %s", self.id, err)
        finally:
            self._done()

    def _done(self) -> None:
        """Closed: the locks held under it were released with it."""
        with self._state:
            locks = list(self._locks)
            self._locks.clear()
        for lock in locks:
            lock._session_ended()
        self._client._forget_session(self)

    def _start(self) -> None:
        if self._thread is not None:
            self._thread.start()

    def _add(self, lock: "Lock") -> None:
        """A lock granted under this session."""
        with self._state:
            if not self._closed and not self.lost.is_set():
                self._locks.add(lock)
                return
            closed = self._closed
        # Ended while the acquire was under way.
        if closed:
            lock._session_ended()
        else:
            lock._lose(f"its session {self.id} was lost: {self.lost_reason}")

    def _discard(self, lock: "Lock") -> None:
        with self._state:
            self._locks.discard(lock)

    def _safe(self, ttl: float) -> float:
        drift = self._client.drift
        return ttl * (1 - drift) / (1 + drift)

    def _round(self) -> float:
        return max(self.ttl / 3, ROUND_MIN)

    def _gone(self, reason: str) -> None:
        """The server says the session is not open."""
        self._stopped.set()
        self._lose(reason)

    def _lose(self, reason: str) -> None:
        with self._state:
            if self.lost.is_set() or self._closed:
                return
            # The first reason is the true one; later ones follow from it.
            self.lost_reason = reason
            self.lost.set()
            locks = list(self._locks)
        for lock in locks:
            lock._lose(f"its session {self.id} was lost: {reason}")
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:
                log.exception("fencelock: the on_lost callback of %r failed", self)

    def _keep_alive(self, budget: float) -> bool:
        """One keep-alive, retried within ``budget``."""
        found, sent, ttl = self._client._keep_alive_session(self.id, budget)
        if not found:
            # (A close under way makes this a no-op: see _lose.)
            self._gone(f"session {self.id} is not open any more (it lapsed, or was closed)")
            return False
        with self._state:
            # A session seen lost stays lost: its holder may have acted on it.
            if self.lost.is_set():
                return False
            self._valid_until = max(self._valid_until, sent + self._safe(ttl))
            self._renew_at = sent + max(ttl / 3, ROUND_MIN)
            self.keep_alives += 1
        return True

    def _run(self) -> None:
        while not self._stopped.is_set():
            with self._state:
                wake = min(self._renew_at, self._valid_until)
            if self._stopped.wait(max(0.0, wake - time.monotonic())):
                return
            now = time.monotonic()
            with self._state:
                valid_until, renew_at = self._valid_until, self._renew_at
            if now >= valid_until:
                self._lose("the session's TTL ran out before a keep-alive succeeded")
                return
            if now < renew_at:
                continue
            # Unless the keep-alive below succeeds, try again a little later
            # rather than at once, so that a failing cluster is not hammered.
            with self._state:
                self._renew_at = now + max(self.ttl / 10, ROUND_MIN)
            try:
                # Past the TTL nothing is left to save.
                found = self._keep_alive(min(valid_until - now, self._client.retry_for))
            except (InvalidArgument, PermissionDenied) as err:
                if not self._stopped.is_set():
                    self._lose(f"keep-alive refused: {err}")
                return
            except FencelockError as err:
                # Unavailable or internal: the session stays open until its
                # TTL runs out, and is tried again.
                log.info("fencelock: keeping session %d alive failed: %s", self.id, err)
                continue
            if not found:
                return


class SessionContext:
    """What :meth:`Client.session` returns: opens a session on entering a
    ``with`` block, closes it (best effort) on leaving it."""

    def __init__(self, open_session: Callable[[], Session]):
        self._open = open_session
        self._session: Optional[Session] = None

    def __enter__(self) -> Session:
        self._session = self._open()
        return self._session

    def __exit__(self, *exc: object) -> None:
        if self._session is not None:
            self._session._close_quietly()
