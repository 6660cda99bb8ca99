"""A table that forgets: least recently used entries go once it holds too many, too much, or
once they have been idle too long.

The per-task state the gateway keeps in memory (the history digests, each
conversation's previous call, the reasoning store's loaded tasks) is keyed by ids a
caller chooses; each new id would otherwise stay for the life of the process. Pure
apart from the clock it is given: no I/O, no threads (one event loop uses it).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar, cast

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

Clock = Callable[[], float]


class IdleLru(Generic[K, V]):
    """At most ``max_keys`` entries (and ``max_weight`` of their weights), each kept no
    longer than ``idle_s`` after its last use; the least recently used leaves first.

    Entries are kept in the order of their last use, so the idle ones are all at the
    front: forgetting them costs nothing for the entries that stay. The most recent
    entry stays whatever its weight.
    """

    __slots__ = ("_clock", "_entries", "_idle_s", "_max_keys", "_max_weight", "weight")

    def __init__(
        self,
        max_keys: int,
        idle_s: float | None = None,
        clock: Clock = time.monotonic,
        max_weight: int | None = None,
    ) -> None:
        self._max_keys = max_keys
        self._idle_s = idle_s
        self._clock = clock
        self._max_weight = max_weight
        # key → [last use, value, weight], in the order of last use
        self._entries: OrderedDict[K, list[Any]] = OrderedDict()
        self.weight = 0  # of the entries held

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        """The keys, least recently used first."""
        return iter(self._entries)

    def get(self, key: K) -> V | None:
        """The entry, now its most recent use; None when absent or idle too long."""
        now = self._clock()
        self.forget_idle(now)
        entry = self._entries.get(key)
        if entry is None:
            return None
        entry[0] = now
        self._entries.move_to_end(key)
        return cast(V, entry[1])

    def peek(self, key: K) -> V | None:
        """The entry, its last use unchanged."""
        entry = self._entries.get(key)
        return None if entry is None else cast(V, entry[1])

    def put(self, key: K, value: V, weight: int = 0) -> None:
        """Keep ``value`` as the most recently used entry; forget what no longer fits."""
        now = self._clock()
        self.pop(key)
        self._entries[key] = [now, value, weight]
        self.weight += weight
        self.forget_idle(now)
        self._fit()

    def grow(self, key: K, weight: int) -> None:
        """Add to an entry's weight (its value grew in place); forget what no longer fits."""
        entry = self._entries.get(key)
        if entry is not None:
            entry[2] += weight
            self.weight += weight
            self._fit()

    def pop(self, key: K) -> V | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self.weight -= entry[2]
        return cast(V, entry[1])

    def forget_idle(self, now: float | None = None) -> list[K]:
        """Forget the entries unused for ``idle_s``; the keys forgotten, oldest first."""
        if self._idle_s is None or not self._entries:
            return []
        cutoff = (self._clock() if now is None else now) - self._idle_s
        gone: list[K] = []
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry[0] > cutoff:
                break
            gone.append(key)
            self.pop(key)
        return gone

    def _fit(self) -> None:
        while len(self._entries) > self._max_keys or (
            self._max_weight is not None
            and self.weight > self._max_weight
            and len(self._entries) > 1
        ):
            self.pop(next(iter(self._entries)))
