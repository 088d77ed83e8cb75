"""Watches and election observers: :class:`Watch` and :class:`Observer`.

A :class:`Watch` follows the changes of holders of the keys under a prefix,
in log order, by asking any node for the changes after the last index it
was told (a long poll, ``WatchRequest``; docs/protocol.md, "Watches"). It
resumes where it was after a reconnect or on another node: every node keeps
a history of the changes, so a follower answers as well as the leader. A
position a node no longer holds comes back ``compacted``, with the current
holders. An :class:`Observer` follows one election (one key) on a watch and
tells each new leader, and each new value it proclaims, once, in log order.
"""

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Deque, Iterator, List, Optional, Tuple

from . import client_pb2 as pb
from .errors import Internal

if TYPE_CHECKING:
    from .client import Client, LockInfo

#: The longest wait the server accepts for one watch request (seconds).
WAIT_MAX = 60.0

#: WatchEventKind's numbers, as client.proto gives them.
EVENT_KINDS = {
    1: "granted",
    2: "released",
    3: "expired",
    4: "delayed",
    5: "delay_lifted",
    6: "proclaimed",
}
#: The kinds after which the key has no holder.
FREEING_KINDS = frozenset({"released", "expired", "delayed", "delay_lifted"})


@dataclass(frozen=True)
class WatchEvent:
    """One change of a watched key: ``index`` is the log index of the entry
    that made it, ``kind`` one of ``"granted"`` (a new holder, under a new
    token), ``"released"`` (released by its holder, or by force),
    ``"expired"`` (its lease ran out), ``"delayed"`` (its lease ran out and
    the key is held back by lock-delay), ``"delay_lifted"`` (the delay is
    over: the key is free), ``"proclaimed"`` (the holder proclaimed a new
    value) or ``"unknown"`` (a kind newer than this client). ``token`` and
    ``owner`` are the lock's the change is about, ``value`` its value after
    the change."""

    index: int
    key: bytes
    kind: str
    token: int
    owner: bytes
    value: bytes

    @classmethod
    def _from(cls, event: "pb.WatchEvent") -> "WatchEvent":
        kind = EVENT_KINDS.get(int(event.kind), "unknown")
        return cls(event.index, event.key, kind, event.token, event.owner, event.value)


@dataclass(frozen=True)
class WatchBatch:
    """One answer of a watch: the changes after the position asked, in log
    order; ``index``, the position every change up to which has been told
    (where the next request starts); ``current``, the holders of the watched
    keys as of ``index`` (at the start, or when ``compacted``), else None;
    ``compacted``: the position asked was older than the node's history, so
    changes may have been missed, and ``current`` says where things stand."""

    events: List[WatchEvent]
    index: int
    current: Optional[List["LockInfo"]]
    compacted: bool

    @classmethod
    def _from(cls, answer: "pb.WatchResponse") -> "WatchBatch":
        from .client import LockInfo

        current = [LockInfo._from(info) for info in answer.current] if answer.has_current else None
        return cls([WatchEvent._from(e) for e in answer.events], answer.index, current, answer.compacted)


class Watch:
    """Follows the holders of the keys under a prefix; made by
    :meth:`Client.watch`. Not thread-safe: one thread calls :meth:`next`.

    ``position``: the log index up to which every change has been told (a
    position to resume from with ``client.watch(prefix, after=position)``);
    None before the first answer."""

    def __init__(self, client: "Client", prefix: bytes, after: Optional[int] = None, limit: int = 0):
        if after is not None and (not isinstance(after, int) or isinstance(after, bool) or after < 0):
            raise TypeError(f"after is a log index (an int of 0 or more), not {after!r}")
        self._client = client
        self.prefix = prefix
        self.position: Optional[int] = after
        self._limit = limit

    def __repr__(self) -> str:
        return f"Watch(prefix={self.prefix!r}, position={self.position})"

    def next(self, wait: float = 30.0) -> WatchBatch:
        """Waits up to ``wait`` seconds (at most 60) for changes and returns
        them; an empty batch: nothing changed within ``wait``. The first call
        without a position answers at once, with the current holders
        (``current``); so does a position the node no longer holds
        (``compacted``). Retries across the nodes like every call (any node
        may answer), within the client's ``retry_for`` plus ``wait``."""
        from .client import _expect, _millis

        after = self.position
        # The first answer (no position) comes at once, with the holders.
        wait_s = 0.0 if after is None else _millis(wait, "wait") / 1000.0
        wait_until = time.monotonic() + wait_s
        timeout = self._client.request_timeout
        prefix, limit = self.prefix, self._limit

        def make() -> Tuple[pb.Request, float]:
            # A retry on another node waits only for what is left.
            left = max(0.0, wait_until - time.monotonic())
            request = pb.Request(watch=pb.WatchRequest(
                prefix=prefix, after_index=after or 0, start=after is None,
                wait_ms=_millis(left, "wait"), limit=limit))
            return request, left + timeout

        response, _, _ = self._client._call(make, self._client.retry_for + wait_s)
        answer = _expect(response, "watch").watch
        if after is not None and answer.index < after:
            raise Internal(f"a watch after index {after} was answered with index {answer.index}")
        batch = WatchBatch._from(answer)
        self.position = batch.index
        return batch


@dataclass(frozen=True)
class Leader:
    """An election's leader: the holder of its key, with its fencing token,
    its owner and the value it campaigned with or last proclaimed."""

    token: int
    owner: bytes
    value: bytes


@dataclass(frozen=True)
class LeaderChange:
    """A change of an election's leader: ``leader`` from now on (None: no
    one leads), at log ``index`` (for the first, the index the state was
    read at)."""

    leader: Optional[Leader]
    index: int


class _Unset:
    pass


_UNSET = _Unset()


class ObserverState:
    """The observer's fold, without IO (as the Rust clients' ``ObserverState``):
    watch answers on the election's key in, each change of leader or of its
    value out, once, in log order."""

    def __init__(self, key: bytes):
        self.key = key
        # The state last told; _UNSET before the first.
        self._told: object = _UNSET
        self._queue: Deque[LeaderChange] = deque()

    def pop(self) -> Optional[LeaderChange]:
        return self._queue.popleft() if self._queue else None

    def has_told(self) -> bool:
        return self._told is not _UNSET

    def take(self, batch: WatchBatch) -> None:
        if batch.current is not None:
            leader = None
            for info in batch.current:
                if info.key == self.key:
                    leader = None if info.delayed else Leader(info.token, info.owner, info.value)
                    break
            self._tell(leader, batch.index)
        for event in batch.events:
            if event.key != self.key:
                continue
            if event.kind in ("granted", "proclaimed"):
                self._tell(Leader(event.token, event.owner, event.value), event.index)
            elif event.kind in FREEING_KINDS:
                self._tell(None, event.index)

    def _tell(self, leader: Optional[Leader], index: int) -> None:
        if self._told is not _UNSET and self._told == leader:
            return
        self._told = leader
        self._queue.append(LeaderChange(leader, index))


class Observer:
    """Follows one election: who leads now, then each new leader and each
    value it proclaims, in log order; made by :meth:`Client.observe`.
    Iterating over it yields every :class:`LeaderChange`, forever. Not
    thread-safe: one thread calls :meth:`next`."""

    def __init__(self, watch: Watch, key: bytes):
        self._watch = watch
        self._state = ObserverState(key)
        self.election = key

    def __repr__(self) -> str:
        return f"Observer(election={self.election!r}, position={self._watch.position})"

    @property
    def position(self) -> Optional[int]:
        """The log index up to which the election has been followed."""
        return self._watch.position

    def next(self, wait: float = 30.0) -> Optional[LeaderChange]:
        """Waits up to ``wait`` seconds for the leader to change, and says
        how; the first call says who leads now. None: nothing changed
        within ``wait``."""
        from .client import _millis

        deadline = time.monotonic() + _millis(wait, "wait") / 1000.0
        while True:
            change = self._state.pop()
            if change is not None:
                return change
            left = max(0.0, deadline - time.monotonic())
            if left <= 0 and self._state.has_told():
                return None
            self._state.take(self._watch.next(min(left, WAIT_MAX)))

    def __iter__(self) -> Iterator[LeaderChange]:
        while True:
            change = self.next(30.0)
            if change is not None:
                yield change


__all__ = ["Leader", "LeaderChange", "Observer", "Watch", "WatchBatch", "WatchEvent"]
