"""Retention in the state database: the rows of tasks idle for ``retention.task_days``.

A task's reasoning goes once nothing was written to it since the cutoff (its
``state_tasks`` row's ``written_at``, as a task folder's newest file); a (task, purpose)'s
history once no request of it came since. Deleted in batches, each a statement of its
own, so no statement holds many rows locked for long; a task being written at that
moment is skipped (its row is locked) and is not idle anyway. The SQL text stays here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial

import asyncpg

from boundedcode_gateway.database.pool import PostgresPool
from boundedcode_gateway.state.database import SWEEP_TIMEOUT_S

BATCH_ROWS = 1000

# Tasks whose reasoning is idle, with every item of theirs.
DELETE_IDLE_REASONING_SQL = """
WITH idle AS (
    DELETE FROM state_tasks WHERE task IN (
        SELECT task FROM state_tasks WHERE written_at < $1
        ORDER BY written_at LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING task
), items AS (
    DELETE FROM state_reasoning WHERE task IN (SELECT task FROM idle)
)
SELECT task FROM idle
"""

DELETE_IDLE_HISTORY_SQL = """
DELETE FROM state_history WHERE (task, purpose) IN (
    SELECT task, purpose FROM state_history WHERE updated_at < $1
    ORDER BY updated_at LIMIT $2
    FOR UPDATE SKIP LOCKED
)
RETURNING task
"""


async def _delete(sql: str, cutoff: datetime, conn: asyncpg.Connection) -> list[str]:
    return [row[0] for row in await conn.fetch(sql, cutoff, BATCH_ROWS)]


async def remove_idle_tasks(db: PostgresPool, cutoff: float) -> list[str]:
    """Delete the rows idle since ``cutoff`` (a ``time.time()``); the tasks that lost rows.
    A failure raises ``DatabaseUnavailable`` (the sweep tries again on its next pass)."""
    at = datetime.fromtimestamp(cutoff, UTC)
    removed: dict[str, None] = {}
    for sql in (DELETE_IDLE_REASONING_SQL, DELETE_IDLE_HISTORY_SQL):
        while True:
            tasks = await db.run("sweep", partial(_delete, sql, at), SWEEP_TIMEOUT_S)
            removed.update(dict.fromkeys(tasks))
            if len(tasks) < BATCH_ROWS:
                break
    return list(removed)
