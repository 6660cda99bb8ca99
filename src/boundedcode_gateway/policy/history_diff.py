"""Which message of a request first differs from the previous request of its kind.

The call log's ``changed`` field: for each (task, purpose) the gateway keeps
one digest per message of the last request, and compares the next one to it.
Pure apart from that bounded in-memory table; it must not do I/O. ``History`` is
what the call flow sees of it; a PostgreSQL database several gateways share keeps
the same table in ``state/pg_history.py``, with the stable digests below.
"""

from __future__ import annotations

import hashlib
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from boundedcode_gateway.lru import Clock, IdleLru

GREW_ONLY = -1


def message_digest(message: Any) -> int:
    """A digest of one message's canonical JSON (sorted keys), so key order never counts.

    Python's own keyed 64-bit hash of those bytes: the table lives in this process
    only, and two different messages at one index collide once in 2**64. blake2b
    took three times as long as the JSON itself (about 0.2 ms for a 50 KB history).
    """
    return hash(orjson.dumps(message, option=orjson.OPT_SORT_KEYS))


def first_changed(previous: Sequence[int], current: Sequence[int]) -> int:
    """Index of the first message that differs, or -1 when ``current`` only extends ``previous``.

    A message that the previous request had and this one lacks counts as changed,
    so a shortened history gives the index where it now ends.
    """
    for i, old in enumerate(previous):
        if i >= len(current) or current[i] != old:
            return i
    return GREW_ONLY


def stable_digest(message: Any) -> int:
    """``message_digest``'s value for a table other processes read too: a 64-bit BLAKE2b of
    the same bytes, the same in every process (``hash`` is keyed per process)."""
    canonical = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
    return int.from_bytes(hashlib.blake2b(canonical, digest_size=8).digest(), "little", signed=True)


def pack_digests(digests: array[int]) -> bytes:
    """Signed 64-bit little-endian, 8 bytes a message, whatever this machine's byte order."""
    if sys.byteorder == "big":
        digests = array("q", digests)
        digests.byteswap()
    return digests.tobytes()


def unpack_digests(packed: bytes) -> array[int]:
    """``pack_digests`` undone; a trailing part of fewer than 8 bytes is left out."""
    digests = array("q")
    digests.frombytes(packed[: len(packed) - len(packed) % 8])
    if sys.byteorder == "big":
        digests.byteswap()
    return digests


@dataclass(frozen=True, slots=True)
class Comparison:
    """A request compared with the previous one of its task and purpose: ``changed`` (None
    when it cannot be known), and the request's own digests, one a message, for a
    comparison with an earlier request of its conversation (a side request may have come
    in between)."""

    changed: int | None
    digests: array[int]


class History(Protocol):
    """The table behind ``changed``, whichever backend keeps it."""

    def __len__(self) -> int:
        """The (task, purpose) pairs held in this process's memory."""
        ...

    async def compare(self, task: str, purpose: str, messages: Sequence[Any]) -> Comparison:
        """Record this request's messages and compare them with the previous request's
        (``changed`` None when the table could not be read). A message that cannot be
        encoded raises ``TypeError`` (a body nested too deep)."""
        ...

    async def changed(self, task: str, purpose: str, messages: Sequence[Any]) -> int | None:
        """``compare``'s ``changed``."""
        ...


# the digests kept over all (task, purpose) pairs: 8 bytes each, 32 MiB in all
MAX_DIGESTS = 4 * 1024 * 1024


class HistoryTracker:
    """Remembers the last request's message digests per (task, purpose): at most ``max_keys``
    pairs and ``max_digests`` digests, none idle for longer than ``idle_s``; the least
    recently used pair is forgotten first, and its next request reports ``-1``."""

    def __init__(
        self,
        max_keys: int = 4096,
        idle_s: float | None = None,
        clock: Clock = time.monotonic,
        max_digests: int = MAX_DIGESTS,
    ) -> None:
        self._last: IdleLru[tuple[str, str], array[int]] = IdleLru(
            max_keys, idle_s, clock, max_weight=max_digests
        )

    def __len__(self) -> int:
        return len(self._last)

    def observe(self, task: str, purpose: str, messages: Sequence[Any]) -> int:
        """Record this request's messages and return ``changed`` for it."""
        return self._observed(task, purpose, messages)[0]

    def _observed(self, task: str, purpose: str, messages: Sequence[Any]) -> tuple[int, array[int]]:
        # signed 64-bit, as hash() gives them: a third of the memory of a list of ints
        digests = array("q", [message_digest(m) for m in messages])
        key = (task, purpose)
        previous = self._last.pop(key)
        self._last.put(key, digests, len(digests))
        if previous is None:
            return GREW_ONLY, digests
        return first_changed(previous, digests), digests

    async def compare(self, task: str, purpose: str, messages: Sequence[Any]) -> Comparison:
        """``observe``, with the digests, as ``History`` has it."""
        return Comparison(*self._observed(task, purpose, messages))

    async def changed(self, task: str, purpose: str, messages: Sequence[Any]) -> int:
        """``observe``, as ``History`` has it."""
        return self.observe(task, purpose, messages)
