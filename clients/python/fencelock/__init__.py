"""A Python client for fencelock, a distributed lock service with fencing
tokens (the wire protocol: docs/protocol.md in the fencelock repository).

    from fencelock import Client, Held

    client = Client(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"])
    try:
        with client.lock("jobs/nightly", ttl=10) as lock:
            write_to_resource(token=lock.token)   # the resource checks the token
            if lock.is_lost():
                ...                               # stop: the lock is not ours any more
    except Held as held:
        print("held by token", held.holder_token)

Leader election: ``client.campaign(election, value, ttl)`` leads (a
:class:`Lock`, with ``proclaim``), ``client.observe(election)`` follows who
leads; ``client.watch(prefix)`` follows the holders of keys under a prefix.
Read-write locks and semaphores: ``client.lock_shared(key, Share.READ, ttl)``
(or ``Share.WRITE``, ``Share.permit(n)``); ``client.holders(key)`` tells
every holder.
Sessions: ``with client.session(ttl=10) as session:`` and
``client.acquire(key, session=session)``: one keep-alive for many locks, all
freed at once when the session closes or lapses.

Standard library and ``protobuf`` only; thread-based.
"""

from .client import Client, Grant, LockInfo, Member, NodeStatus, default_owner
from .errors import (
    Delayed,
    FencelockError,
    Held,
    Internal,
    InvalidArgument,
    NoSession,
    NotAcquired,
    PermissionDenied,
    ResourceExhausted,
    StaleToken,
    Unavailable,
    WaitTimedOut,
)
from .fenced import FencedRegister
from .lock import Lock
from .session import Session
from .share import Share
from .watch import Leader, LeaderChange, Observer, Watch, WatchBatch, WatchEvent

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Delayed",
    "FencedRegister",
    "FencelockError",
    "Grant",
    "Held",
    "Internal",
    "InvalidArgument",
    "Leader",
    "LeaderChange",
    "Lock",
    "LockInfo",
    "Member",
    "NoSession",
    "NodeStatus",
    "NotAcquired",
    "Observer",
    "PermissionDenied",
    "ResourceExhausted",
    "Session",
    "Share",
    "StaleToken",
    "Unavailable",
    "WaitTimedOut",
    "Watch",
    "WatchBatch",
    "WatchEvent",
    "default_owner",
]
