"""How an acquire shares its key: :class:`Share`.

A key is one kind at a time: a plain lock (``Client.acquire``), a
read-write lock (many readers or one writer) or a semaphore of N permits, N
fixed by the key's first acquire. Each holder of a shared key has a fencing
token and a lease of its own.
"""

from dataclasses import dataclass
from typing import ClassVar, Tuple

from . import client_pb2 as pb
from .errors import InvalidArgument

#: The most permits a semaphore may have: the server refuses more
#: (``PERMITS_MAX`` in crates/types), so the client says so before sending.
PERMITS_MAX = 100_000

#: The kinds an acquire may ask for; ``LockInfo.share`` adds ``"exclusive"``
#: (a plain lock's holder).
_KINDS = ("read", "write", "permit")


@dataclass(frozen=True)
class Share:
    """A reader (``Share.READ``) or the writer (``Share.WRITE``) of a
    read-write lock, or one permit of a semaphore of ``permits``
    (``Share.permit(n)``, 1 to 100,000). ``kind`` is ``"read"``, ``"write"``
    or ``"permit"``; ``permits`` is 0 for a read-write lock. A bad kind or
    number raises :class:`~fencelock.InvalidArgument` (a number that is not
    an ``int``: ``TypeError``)."""

    kind: str
    permits: int = 0

    READ: ClassVar["Share"]
    WRITE: ClassVar["Share"]

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise InvalidArgument(f"a share is 'read', 'write' or 'permit', not {self.kind!r}")
        if not isinstance(self.permits, int) or isinstance(self.permits, bool):
            raise TypeError(f"permits is an int, not {self.permits!r}")
        if self.kind == "permit" and not 1 <= self.permits <= PERMITS_MAX:
            raise InvalidArgument(f"a semaphore has 1 to {PERMITS_MAX:,} permits, not {self.permits}")
        if self.kind != "permit" and self.permits != 0:
            raise InvalidArgument(f"a {self.kind} share has no permits (got {self.permits})")

    @classmethod
    def permit(cls, permits: int) -> "Share":
        """One permit of a semaphore of ``permits``."""
        return cls("permit", permits)

    def __repr__(self) -> str:
        return f"Share.permit({self.permits})" if self.kind == "permit" else f"Share.{self.kind.upper()}"

    def _to_pb(self) -> Tuple[int, int]:
        """The wire share and permits."""
        return {"read": pb.READ, "write": pb.WRITE, "permit": pb.PERMIT}[self.kind], self.permits


Share.READ = Share("read")
Share.WRITE = Share("write")


def check_share(share: object) -> Share:
    """``share`` if it is a :class:`Share`; a clear error before anything
    is sent otherwise."""
    if not isinstance(share, Share):
        raise TypeError(f"share is Share.READ, Share.WRITE or Share.permit(n), not {share!r}")
    return share


#: LockInfo.share by the wire's Share; a number newer than this client is
#: "unknown".
SHARE_NAMES = {pb.EXCLUSIVE: "exclusive", pb.READ: "read", pb.WRITE: "write", pb.PERMIT: "permit"}
