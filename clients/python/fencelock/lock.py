"""A held lock, renewed in the background: :class:`Lock`.

How long a client may count on a lock (docs/leases.md): the lease counts
from when the acquire or renewal that got it was **sent**, and, allowing
clocks (the client's and the nodes') a rate error of ρ (``drift``), lasts

    sent + ttl × (1 − ρ) / (1 + ρ)

by the client's monotonic clock. :meth:`Lock.time_left` tells what is left
of that. A daemon thread per Lock renews it every third of its ttl,
counting the lease again from each renewal's send time. The lock is lost,
and :attr:`Lock.lost` set, when a renewal is refused (the token no longer
holds the key) or when the time above runs out before a renewal succeeded
(the cluster lost its quorum, say). A lost lock is not renewed again: its
holder may already have acted on its loss.

Within one process, one Lock per owner and key: the server answers an
acquire by the owner that holds the key with the same token (that is what
makes a retried acquire safe), so two Locks of one owner would share a lock,
and the first release would end both. A second acquire waits for the first
Lock to be released, or fails as it would for another owner.
"""

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

from .errors import FencelockError, Held, InvalidArgument, PermissionDenied, WaitTimedOut

if TYPE_CHECKING:
    from .client import Client, Grant
    from .session import Session
    from .share import Share

log = logging.getLogger("fencelock")

#: The shortest pause between renewal attempts, so that a tiny lease cannot
#: make the renewer spin.
ROUND_MIN = 0.010


class _LocalHolds:
    """The keys this process holds (or is acquiring) through Locks, by owner
    and key, with the token granted (0 while the acquire is under way)."""

    def __init__(self) -> None:
        self._held: Dict[Tuple[bytes, bytes], int] = {}
        self._freed = threading.Condition()

    def take(self, owner: bytes, key: bytes, wait: float) -> "_LocalHold":
        """Takes ``key`` for ``owner``, waiting up to ``wait`` seconds for
        another Lock of this process to let it go."""
        deadline = time.monotonic() + max(0.0, wait)
        ident = (owner, key)
        with self._freed:
            while ident in self._held:
                left = deadline - time.monotonic()
                if left <= 0:
                    holder = self._held[ident] or None
                    raise Held(holder) if wait <= 0 else WaitTimedOut(holder)
                self._freed.wait(left)
            self._held[ident] = 0
        return _LocalHold(self, ident)

    def _granted(self, ident: Tuple[bytes, bytes], token: int) -> None:
        with self._freed:
            if ident in self._held:
                self._held[ident] = token

    def _free(self, ident: Tuple[bytes, bytes]) -> None:
        with self._freed:
            self._held.pop(ident, None)
            self._freed.notify_all()


class _LocalHold:
    def __init__(self, holds: _LocalHolds, ident: Tuple[bytes, bytes]):
        self._holds = holds
        self._ident = ident
        self._freed = False

    def granted(self, token: int) -> None:
        self._holds._granted(self._ident, token)

    def free(self) -> None:
        if not self._freed:
            self._freed = True
            self._holds._free(self._ident)


local_holds = _LocalHolds()


class Lock:
    """A lock held through a :class:`~fencelock.Client`, made by
    :meth:`Client.acquire` or :meth:`Client.lock`.

    ``key`` (as given), ``token`` (the fencing token: pass it with every
    write to the protected resource), ``ttl`` (the lease granted, seconds),
    ``existing`` (the server handed over the grant this owner held already:
    a retried acquire whose first answer was lost, or a lock left by an
    earlier run under the same owner), ``renewals`` (how many succeeded),
    ``lost`` (a :class:`threading.Event`), ``lost_reason``, ``share`` (the
    :class:`~fencelock.Share` of :meth:`Client.acquire_shared`; None for a
    plain lock), ``session`` (the :class:`~fencelock.Session` it is held
    under, or None for a lease of its own).

    A Lock held under a session has no renewal of its own: the session's
    keep-alive renews it, ``ttl`` and :meth:`time_left` are the session's,
    and it is lost when the session is lost. Closing the session releases
    it (:meth:`release` then says False); releasing it alone leaves the
    session and its other locks as they are.

    ``on_lost(lock)``, if given, is called once when the lock is lost, on
    the thread that notices (the renewal thread, or one calling
    :meth:`is_lost` or :meth:`time_left`); what it raises is logged.
    """

    def __init__(
        self,
        client: "Client",
        key: Any,
        key_bytes: bytes,
        grant: "Grant",
        hold: _LocalHold,
        on_lost: Optional[Callable[["Lock"], None]] = None,
        share: Optional["Share"] = None,
        session: Optional["Session"] = None,
    ):
        self.key = key
        self.key_bytes = key_bytes
        self.share = share
        self.session = session
        self.token: int = grant.token
        self.ttl: float = grant.ttl
        self.existing: bool = grant.existing
        self.lost = threading.Event()
        self.lost_reason: Optional[str] = None
        self.renewals = 0
        self._client = client
        self._hold = hold
        self._on_lost = on_lost
        self._state = threading.Lock()
        self._stopped = threading.Event()
        self._valid_until = grant.sent + self._safe(grant.ttl)
        self._renew_at = grant.sent + self._round()
        self._thread = threading.Thread(target=self._run, name=f"fencelock-renew-{self.token}", daemon=True)

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else "released" if self._stopped.is_set() else "held"
        share = "" if self.share is None else f", share={self.share!r}"
        session = "" if self.session is None else f", session={self.session.id}"
        return f"Lock(key={self.key!r}, token={self.token}, ttl={self.ttl}{share}{session}, {state})"

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, *exc: object) -> None:
        self._release_quietly()

    def time_left(self) -> float:
        """The seconds the client may still count on the lock: from the send
        time of the last successful acquire or renewal, the lease less the
        drift margin, less the time since. 0 once lost, never negative."""
        if self.lost.is_set():
            return 0.0
        if self.session is not None:
            # Held under a session: its time is the session's (whose loss
            # loses this lock too).
            left = self.session.time_left()
            if left <= 0 and not self._stopped.is_set() and not self.session.closed:
                self._lose(f"its session {self.session.id} was lost: {self.session.lost_reason}")
            return left
        with self._state:
            left = self._valid_until - time.monotonic()
        if left <= 0:
            self._lose("the lease ran out before a renewal succeeded")
            return 0.0
        return left

    def is_lost(self) -> bool:
        """True once the lock is lost: a renewal was refused, or the lease
        ran out unrenewed. Check it before acting on the lock."""
        self.time_left()
        return self.lost.is_set()

    def proclaim(self, value: Any) -> bool:
        """Replaces the lock's value (an election's leader proclaims a new
        one; str or bytes, up to 4,096 bytes). False: the token no longer
        holds the key."""
        return self._client.proclaim(self.key_bytes, self.token, value)

    def release(self) -> bool:
        """Stops renewing and releases the lock. False: it was lost (or
        released) already, or the token no longer held the key."""
        if self._stopped.is_set():
            return False
        self._stopped.set()
        try:
            if self.is_lost():
                return False
            return self._client.release(self.key_bytes, self.token)
        finally:
            self._done()

    def _release_quietly(self) -> None:
        """As :meth:`release`, within one request timeout, never raising:
        an unreleased lock still expires with its lease."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        try:
            if not self.is_lost():
                self._client._release(self.key_bytes, self.token, False, self._client.request_timeout)
        except FencelockError as err:
            log.warning("fencelock: releasing %r (token %d) failed: %s", self.key, self.token, err)
        finally:
            self._done()

    def _done(self) -> None:
        self._hold.free()
        self._client._forget_lock(self)
        if self.session is not None:
            self.session._discard(self)

    def _session_ended(self) -> None:
        """Its session was closed, which released it."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._done()

    def _start(self) -> None:
        # Under a session the session's keep-alive renews it.
        if self.session is None:
            self._thread.start()

    def _safe(self, ttl: float) -> float:
        drift = self._client.drift
        return ttl * (1 - drift) / (1 + drift)

    def _round(self) -> float:
        return max(self.ttl / 3, ROUND_MIN)

    def _lose(self, reason: str) -> None:
        with self._state:
            if self.lost.is_set():
                return
            # The first reason is the true one; later ones follow from it.
            self.lost_reason = reason
            self.lost.set()
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:
                log.exception("fencelock: the on_lost callback of %r failed", self)

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
                self._lose("the lease ran out before a renewal succeeded")
                return
            if now < renew_at:
                continue
            # Unless the renewal below succeeds, try again a little later
            # rather than at once, so that a failing cluster is not hammered.
            with self._state:
                self._renew_at = now + max(self.ttl / 10, ROUND_MIN)
            try:
                # Past the lease nothing is left to save.
                renewed, sent, lease, holder = self._client._renew(
                    self.key_bytes, self.token, self.ttl, min(valid_until - now, self._client.retry_for))
            except (InvalidArgument, PermissionDenied) as err:
                if not self._stopped.is_set():
                    self._lose(f"renewal refused: {err}")
                return
            except FencelockError as err:
                # Unavailable or internal: the lock stays held until its lease
                # runs out, and is tried again.
                log.info("fencelock: renewing %r (token %d) failed: %s", self.key, self.token, err)
                continue
            if self._stopped.is_set():
                return
            if not renewed:
                self._lose(f"renewal refused: token {self.token} no longer holds the key"
                           f" (holder token {holder or 'none'})")
                return
            with self._state:
                # A lock seen lost stays lost: its holder may have acted on it.
                if not self.lost.is_set():
                    self._valid_until = max(self._valid_until, sent + self._safe(lease))
                    self._renew_at = sent + max(lease / 3, ROUND_MIN)
                    self.renewals += 1


class LockContext:
    """What :meth:`Client.lock` and :meth:`Client.lock_shared` return:
    acquires (``acquire()``) on entering a ``with`` block, releases (best
    effort) on leaving it."""

    def __init__(self, acquire: Callable[[], Lock]):
        self._acquire = acquire
        self._lock: Optional[Lock] = None

    def __enter__(self) -> Lock:
        self._lock = self._acquire()
        return self._lock

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock._release_quietly()

