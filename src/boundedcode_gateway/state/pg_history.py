"""The history behind ``changed`` in PostgreSQL (``state:``): per task and purpose, the
digests of the last request's messages, in one row several gateways share.

Each request swaps its digests in and gets the previous request's back in one statement,
under the row's lock, so two gateways serving one conversation in turn compare each
request with the one just before it, whichever gateway served that. The row's version
is new for each request (a sequence over every row, so never the same twice, also once
retention removed a row): a gateway that holds the version being replaced (it served
the previous request) is not sent its digests again. The digests are ``stable_digest``'s,
the same in every process. When the database fails, ``changed`` is None (not known).
The SQL text stays in this file.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import asyncpg

from boundedcode_gateway.database.pool import DatabaseUnavailable, PostgresPool
from boundedcode_gateway.lru import Clock, IdleLru
from boundedcode_gateway.policy.history_diff import (
    GREW_ONLY,
    MAX_DIGESTS,
    Comparison,
    first_changed,
    pack_digests,
    stable_digest,
    unpack_digests,
)

# This request's digests ($3) in, the previous request's version and (unless it is $4,
# the version this gateway holds) its digests out; a first request inserts the row. No
# row: another gateway inserted it at the same moment (the statement is run again).
SWAP_DIGESTS_SQL = """
WITH updated AS (
    UPDATE state_history AS h
    SET version = nextval('state_history_versions'), digests = $3, updated_at = now()
    FROM (
        SELECT task, purpose, version, digests FROM state_history
        WHERE task = $1 AND purpose = $2
        FOR UPDATE
    ) AS old
    WHERE h.task = old.task AND h.purpose = old.purpose
    RETURNING h.version, old.version AS previous_version,
        CASE WHEN old.version = $4 THEN NULL ELSE old.digests END AS previous_digests
), inserted AS (
    INSERT INTO state_history (task, purpose, version, digests, updated_at)
    SELECT $1, $2, nextval('state_history_versions'), $3, now()
    WHERE NOT EXISTS (SELECT FROM updated)
    ON CONFLICT (task, purpose) DO NOTHING
    RETURNING version, NULL::bigint AS previous_version, NULL::bytea AS previous_digests
)
SELECT version, previous_version, previous_digests FROM updated
UNION ALL
SELECT version, previous_version, previous_digests FROM inserted
"""
# a first request that met another's insert is run again once more than this
SWAP_TRIES = 3


@dataclass(frozen=True, slots=True)
class Swapped:
    """What the swap found: the row's version now, the previous request's version (None:
    this is the first), and its digests (None: the version this gateway holds)."""

    version: int
    previous_version: int | None
    previous_digests: bytes | None


@dataclass(frozen=True, slots=True)
class HeldDigests:
    version: int
    digests: array[int]


async def _swap(
    task: str, purpose: str, packed: bytes, held_version: int, conn: asyncpg.Connection
) -> Swapped | None:
    for _ in range(SWAP_TRIES):
        row = await conn.fetchrow(SWAP_DIGESTS_SQL, task, purpose, packed, held_version)
        if row is not None:
            return Swapped(row["version"], row["previous_version"], row["previous_digests"])
    return None


class PostgresHistory:
    """The digests per (task, purpose) in the state database; at most ``max_keys`` pairs
    and ``max_digests`` digests held in memory, none idle for longer than ``idle_s``."""

    def __init__(
        self,
        db: PostgresPool,
        max_keys: int = 4096,
        idle_s: float | None = None,
        clock: Clock = time.monotonic,
        max_digests: int = MAX_DIGESTS,
    ) -> None:
        self._db = db
        self._held: IdleLru[tuple[str, str], HeldDigests] = IdleLru(
            max_keys, idle_s, clock, max_weight=max_digests
        )

    def __len__(self) -> int:
        return len(self._held)

    async def changed(self, task: str, purpose: str, messages: Sequence[Any]) -> int | None:
        """Record this request's messages and return ``changed`` for it; None when the
        database could not be asked."""
        return (await self.compare(task, purpose, messages)).changed

    async def compare(self, task: str, purpose: str, messages: Sequence[Any]) -> Comparison:
        """``changed``, with the request's digests."""
        digests = array("q", [stable_digest(m) for m in messages])
        return Comparison(await self._changed(task, purpose, digests), digests)

    async def _changed(self, task: str, purpose: str, digests: array[int]) -> int | None:
        key = (task, purpose)
        held = self._held.get(key)
        held_version = 0 if held is None else held.version  # versions are positive
        swap = partial(_swap, task, purpose, pack_digests(digests), held_version)
        try:
            swapped = await self._db.run("history", swap)
        except DatabaseUnavailable:
            return None
        if swapped is None:
            return None
        now = self._held.peek(key)
        if now is None or now.version < swapped.version:  # a later request may have been first
            self._held.put(key, HeldDigests(swapped.version, digests), len(digests))
        if swapped.previous_version is None:
            return GREW_ONLY
        if swapped.previous_digests is not None:
            previous = unpack_digests(swapped.previous_digests)
        elif held is not None:
            previous = held.digests
        else:  # not reached: the database sends the digests unless this gateway holds them
            return None
        return first_changed(previous, digests)

    def forget(self, tasks: Sequence[str]) -> None:
        """Let go of the tasks retention removed."""
        gone = set(tasks)
        for key in [k for k in self._held if k[0] in gone]:
            self._held.pop(key)
