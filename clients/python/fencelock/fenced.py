"""The resource's side of fencing: :class:`FencedRegister`.

A lease can always run out while its holder is paused (a GC pause, a
swapped-out process, a SIGSTOP), and the holder cannot see it happen. So a
resource protected by a lock checks the fencing token of every write, and
refuses a token lower than the highest it has seen: the holder whose lease
ran out is turned away once a later holder has written.
"""

import threading
from typing import Any, Dict, Hashable, Optional, Tuple

from .errors import StaleToken


class FencedRegister:
    """Keeps the highest fencing token seen per resource, and a value per
    resource written under it. Thread-safe.

    >>> register = FencedRegister()
    >>> register.check_and_set("db/row-7", 41, "written by the first holder")
    >>> register.check_and_set("db/row-7", 40)
    Traceback (most recent call last):
    ...
    fencelock.errors.StaleToken: stale token 40 for 'db/row-7': token 41 was seen already
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: Dict[Hashable, Tuple[int, Any]] = {}

    def check_and_set(self, resource: Hashable, token: int, value: Any = None) -> None:
        """Accepts a write to ``resource`` under ``token`` (the same token
        again, or a higher one) and keeps ``value``; raises
        :class:`~fencelock.StaleToken` for a token lower than the highest
        seen for ``resource``, and changes nothing then."""
        if not isinstance(token, int) or isinstance(token, bool) or token < 0:
            raise TypeError(f"a fencing token is a non-negative int, not {token!r}")
        with self._lock:
            entry = self._entries.get(resource)
            if entry is not None and token < entry[0]:
                raise StaleToken(resource, token, entry[0])
            self._entries[resource] = (token, value)

    def highest(self, resource: Hashable) -> Optional[int]:
        """The highest token accepted for ``resource``, None before any."""
        with self._lock:
            entry = self._entries.get(resource)
        return None if entry is None else entry[0]

    def get(self, resource: Hashable) -> Optional[Tuple[int, Any]]:
        """``(token, value)`` of the last write accepted, None before any."""
        with self._lock:
            return self._entries.get(resource)
