"""The errors of the fencelock client.

Every error the client raises is a :class:`FencelockError`. The server's
error codes (docs/protocol.md, "Error codes") map to them as follows:

- ``NOT_LEADER``, ``UNAVAILABLE``, ``TIMEOUT``, a closed connection or no
  answer: retried on the leader or the next endpoint, and, once the call's
  ``retry_for`` is spent, :class:`Unavailable`;
- ``INVALID_ARGUMENT``: :class:`InvalidArgument`;
- ``PERMISSION_DENIED``: :class:`PermissionDenied`;
- ``RESOURCE_EXHAUSTED``: :class:`ResourceExhausted`;
- ``NO_SESSION``: :class:`NoSession`;
- ``INTERNAL`` (or an answer the client cannot read): :class:`Internal`.

An acquire that did not get its lock raises :class:`Held` (another owner
holds the key, and the acquire did not wait), :class:`Delayed` (the key is
held back by lock-delay after its lock expired) or :class:`WaitTimedOut`.
"""

from typing import Optional


class FencelockError(Exception):
    """The base of every error this package raises."""


class Unavailable(FencelockError):
    """No node answered the call within its ``retry_for``: no leader, every
    endpoint down or overloaded. The message names the last reason."""


class InvalidArgument(FencelockError):
    """The request is malformed or out of the server's bounds (a lease too
    short or too long, an empty or too long key); retrying will not help."""


class PermissionDenied(FencelockError):
    """TLS only: the user may not do this (docs/security.md)."""


class ResourceExhausted(FencelockError):
    """A quota was met (locks in the table, locks of one owner, waiters of
    one key); nothing was done. Retrying at once meets the same quota."""


class NoSession(FencelockError):
    """An acquire named a session that is not open: it was closed, or it
    lapsed (everything it held is free), or it never was. Nothing was done;
    open a new session (:meth:`Client.open_session`)."""


class Internal(FencelockError):
    """A bug or a failed node, or an answer that makes no sense."""


class NotAcquired(FencelockError):
    """An acquire that did not get its lock; ``holder_token`` is the token of
    the holder when the server named it, else None."""

    def __init__(self, message: str, holder_token: Optional[int] = None):
        super().__init__(message)
        self.holder_token = holder_token


class Held(NotAcquired):
    """Another owner holds the key (or, within this process, another
    :class:`~fencelock.Lock` of the same owner does), and the acquire did not
    wait (``wait=0``)."""

    def __init__(self, holder_token: Optional[int] = None):
        super().__init__(f"the lock is held (holder token {holder_token})", holder_token)


class Delayed(Held):
    """The key is held back by lock-delay (``fencelockd --lock-delay``): the
    lock under ``holder_token`` expired, and no one is granted the key until
    the delay is over, in about ``left`` seconds by the leader's clock (0 if
    it did not say). A :class:`Held`, so code that handles that handles this."""

    def __init__(self, holder_token: Optional[int] = None, left: float = 0.0):
        NotAcquired.__init__(
            self,
            f"the key is held back by lock-delay after token {holder_token} expired"
            + (f"; it can be granted again in {left:.1f}s" if left > 0 else ""),
            holder_token,
        )
        self.left = left


class WaitTimedOut(NotAcquired):
    """The acquire waited for the key for its whole ``wait`` in vain."""

    def __init__(self, holder_token: Optional[int] = None):
        super().__init__(f"the wait ran out; the lock is held (holder token {holder_token})", holder_token)


class StaleToken(FencelockError):
    """A :class:`~fencelock.FencedRegister` refused a token lower than the
    highest it has seen for the resource."""

    def __init__(self, resource: object, token: int, highest: int):
        super().__init__(f"stale token {token} for {resource!r}: token {highest} was seen already")
        self.resource = resource
        self.token = token
        self.highest = highest
