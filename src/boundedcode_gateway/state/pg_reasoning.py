"""The reasoning store in PostgreSQL (``state:``): every kind of stored reasoning in one
table several gateways share, each gateway holding the tasks it serves in memory.

A task's writers take its ``state_tasks`` row in turn and number their items from it, so
a task's items become visible in the order of their numbers. Each call asks for the
items numbered above the highest its gateway holds (one query, usually empty), and so
finds every item the calls that answered before it kept, whichever gateway served them.
What a call keeps is in this gateway's memory at once and written in the background;
the call's answer ends once it is written (``saved``). The item's JSON is stored as the
bytes the gateway encoded, so it comes back byte for byte.

An answer's reasoning is one row, with every key it is found under in an array (an
answer with 400 tool calls: one row, one copy of the text); a later answer whose keys
cover an earlier one's replaces that row in the same statement. A row belongs to the scope
of the caller that kept it (``call_context.py``): a call finds only its scope's rows, and
replaces only those; rows from before scopes belong to everyone on the task (migration
0003).

When the database fails, a call goes on with the items this gateway holds, and an item
it keeps stays in this gateway's memory only (``database.py`` counts and logs it). The
SQL text stays in this file.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import asyncpg
import orjson

from boundedcode_gateway.call_context import TASK_SCOPE
from boundedcode_gateway.database.pool import DatabaseUnavailable, PostgresPool
from boundedcode_gateway.lru import Clock, IdleLru
from boundedcode_gateway.reasoning_store.store import MAX_BYTES_IN_MEMORY, ReasoningItem

# The items of task $1 numbered above $3, when the task's epoch is still $2; all of them
# when it is not (this gateway holds none, or retention removed the task since); no row
# when the database holds none. One row with a null seq: nothing new.
SELECT_SINCE_SQL = """
SELECT t.epoch, r.seq, r.scope, r.kind, r.keys, r.provider, r.profile, r.data
FROM state_tasks AS t
LEFT JOIN state_reasoning AS r
    ON r.task = t.task AND r.seq > (CASE WHEN t.epoch = $2 THEN $3 ELSE 0 END)
WHERE t.task = $1
ORDER BY r.seq
"""

# One turn's reasoning, found under each of its keys ($3), numbered from the task's row,
# which the statement holds locked until it commits: the next writer of the task waits,
# then numbers its item above this one. An earlier item of the kind and scope ($7) whose
# keys are all among these is found under none of them any more: it goes (a reader that did not read
# it reads this one, numbered above it, with all its keys).
INSERT_ITEM_SQL = """
WITH numbered AS (
    INSERT INTO state_tasks AS t (task, reasoning_seq, written_at)
    VALUES ($1, 1, now())
    ON CONFLICT (task) DO UPDATE
        SET reasoning_seq = t.reasoning_seq + 1, written_at = now()
    RETURNING reasoning_seq
), replaced AS (
    DELETE FROM state_reasoning
    WHERE task = $1 AND scope = $7 AND kind = $2 AND keys <@ $3::text[]
)
INSERT INTO state_reasoning (task, seq, scope, kind, keys, provider, profile, data)
SELECT $1, numbered.reasoning_seq, $7, $2, $3::text[], $4, $5, $6
FROM numbered
"""


@dataclass(slots=True)
class HeldTask:
    """A task's items as this gateway holds them: the task's epoch in the database, and the
    highest item number read (0, 0: none read); the items by scope, kind and key."""

    epoch: int = 0
    seq: int = 0
    items: dict[tuple[str, str, str], ReasoningItem] = field(default_factory=dict)
    size: int = 0  # the bytes of the items' JSON


async def _read_since(
    task: str, epoch: int, seq: int, conn: asyncpg.Connection
) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await conn.fetch(SELECT_SINCE_SQL, task, epoch, seq)
    return rows


async def _insert(
    task: str,
    scope: str,
    kind: str,
    keys: list[str],
    provider: str,
    profile: str,
    data: bytes,
    conn: asyncpg.Connection,
) -> None:
    await conn.execute(INSERT_ITEM_SQL, task, kind, keys, provider, profile, data, scope)


class PostgresReasoningStore:
    """Every task's reasoning in the state database; at most ``max_tasks`` tasks and
    ``max_bytes`` of their items held in memory, none idle for longer than ``idle_s``."""

    def __init__(
        self,
        db: PostgresPool,
        max_tasks: int = 4096,
        idle_s: float | None = None,
        clock: Clock = time.monotonic,
        max_bytes: int = MAX_BYTES_IN_MEMORY,
    ) -> None:
        self._db = db
        self._held: IdleLru[str, HeldTask] = IdleLru(max_tasks, idle_s, clock, max_bytes)
        # the writes under way, so that closing waits for them
        self._writes: set[asyncio.Task[None]] = set()

    @property
    def tasks_in_memory(self) -> int:
        return len(self._held)

    async def task(self, task: str, scope: str = TASK_SCOPE) -> PostgresTaskReasoning:
        """The task's reasoning as the callers of ``scope`` find it, with what the database
        holds that this gateway did not."""
        held = self._held.get(task)
        if held is None:
            held = HeldTask()
            self._held.put(task, held)
        try:
            rows = await self._db.run(
                "read_reasoning", partial(_read_since, task, held.epoch, held.seq)
            )
        except DatabaseUnavailable:
            pass  # the call goes on with what this gateway holds
        else:
            self._apply(task, held, rows)
        return PostgresTaskReasoning(self, task, held, scope)

    def _apply(self, task: str, held: HeldTask, rows: Sequence[asyncpg.Record]) -> None:
        """Add what one read found; a read that an earlier-started one overtook adds only
        what is newer than what it added."""
        epoch = rows[0]["epoch"] if rows else 0
        if rows and epoch < held.epoch:
            return  # read before a newer epoch was applied
        if epoch != held.epoch:
            if held.epoch:
                # retention removed the task since (no row), or removed it and it was
                # written again: what this gateway holds of it is gone
                held.items, held.size = {}, 0
                self._weigh(task, held)
            held.epoch, held.seq = epoch, 0
        grown = 0
        for row in rows:
            seq = row["seq"]
            if seq is None or seq <= held.seq:
                continue
            held.seq = seq
            data: bytes = row["data"]
            try:
                value = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue  # not a row this store wrote
            keys = tuple(row["keys"])
            kind, scope = row["kind"], row["scope"]
            item = ReasoningItem(kind, keys, row["provider"], row["profile"], value, scope)
            for key in keys:
                held.items[(scope, kind, key)] = item
            grown += len(data)
        self._grow(task, held, grown)

    def _weigh(self, task: str, held: HeldTask) -> None:
        if self._held.peek(task) is held:
            self._held.put(task, held, held.size)

    def _grow(self, task: str, held: HeldTask, size: int) -> None:
        held.size += size
        if size and self._held.peek(task) is held:
            self._held.grow(task, size)

    def write(
        self,
        task: str,
        held: HeldTask,
        scope: str,
        kind: str,
        keys: list[str],
        provider: str,
        profile: str,
        data: Any,
    ) -> asyncio.Task[None]:
        """Hold the item at once under each of its keys; write it, one row, in the background
        (the task returned)."""
        encoded = orjson.dumps(data)  # once, however many keys
        item = ReasoningItem(kind, tuple(keys), provider, profile, data, scope)
        for key in keys:
            held.items[(scope, kind, key)] = item
        self._grow(task, held, len(encoded))
        insert = partial(_insert, task, scope, kind, keys, provider, profile, encoded)
        written = asyncio.get_running_loop().create_task(self._written(insert))
        self._writes.add(written)
        written.add_done_callback(self._writes.discard)
        return written

    async def _written(self, insert: partial[Any]) -> None:
        # failed: held by this gateway only (counted and logged by the database)
        with contextlib.suppress(DatabaseUnavailable):
            await self._db.run("write_reasoning", insert)

    def forget(self, tasks: Sequence[str]) -> None:
        """Let go of tasks retention removed."""
        for task in tasks:
            self._held.pop(task)

    async def aclose(self) -> None:
        """Wait for the writes under way (each bounded in time)."""
        if self._writes:
            await asyncio.wait(list(self._writes))


class PostgresTaskReasoning:
    """One task's view of the state database's store, for one call of one scope."""

    __slots__ = ("_held", "_store", "_writes", "scope", "task")

    def __init__(
        self, store: PostgresReasoningStore, task: str, held: HeldTask, scope: str = TASK_SCOPE
    ) -> None:
        self._store = store
        self.task = task
        self._held = held
        self.scope = scope
        self._writes: list[asyncio.Task[None]] = []

    def find(self, kind: str, keys: Sequence[str]) -> ReasoningItem | None:
        """The item of this scope stored under any of the keys."""
        items = self._held.items
        for key in keys:
            item = items.get((self.scope, kind, key))
            if item is not None:
                return item
        return None

    def keep(self, kind: str, keys: Sequence[str], provider: str, profile: str, data: Any) -> None:
        """Store one turn's reasoning once, found under each of its keys (one row, one
        statement)."""
        unique = list(dict.fromkeys(keys))
        if unique:
            written = self._store.write(
                self.task, self._held, self.scope, kind, unique, provider, profile, data
            )
            self._writes.append(written)

    async def saved(self) -> None:
        """Once what this call kept is in the database, or its write failed; a caller that
        goes away meanwhile does not stop the write."""
        if self._writes:
            await asyncio.wait(self._writes)
