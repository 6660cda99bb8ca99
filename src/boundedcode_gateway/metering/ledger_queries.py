"""What the page of calls asks the ledger: recent calls by filter, one page at a time,
and per-task sums. The SQL text and its parameters, built from a filter value, in the
``?`` paramstyle (``numbered`` turns it into PostgreSQL's ``$1``), and the rows made into
the page's answers. Pure: it never touches a connection.

A page ends at a cursor (the last row's ``started_at`` and ``call_id``) rather than an
offset, so calls recorded while a viewer pages do not shift the next page.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from boundedcode_gateway.metering.records import LEDGER_FIELDS, OWN_RECORD_PURPOSES
from boundedcode_gateway.policy.cache_misses import NOT_A_MISS, REPAIR_PURPOSE

_COLUMNS = ", ".join(LEDGER_FIELDS)


@dataclass(frozen=True, slots=True)
class CallFilter:
    """Which calls: each field given narrows the selection; ``before`` is a page's cursor."""

    task: str | None = None
    purpose: str | None = None
    model: str | None = None
    status: str | None = None
    since: str | None = None  # started at or after (ISO 8601, as ``started_at``)
    before: tuple[str, str] | None = None  # (started_at, call_id) of the last row seen
    limit: int = 50


def calls_query(f: CallFilter) -> tuple[str, list[Any]]:
    """Newest first; one row more than the limit, which tells whether a next page exists."""
    where: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("task", f.task),
        ("purpose", f.purpose),
        ("model_profile", f.model),
        ("status", f.status),
    ):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if f.since is not None:
        where.append("started_at >= ?")
        params.append(f.since)
    if f.before is not None:
        where.append("(started_at < ? OR (started_at = ? AND call_id < ?))")
        params += [f.before[0], f.before[0], f.before[1]]
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    sql = (
        f"SELECT {_COLUMNS} FROM model_calls{clause} ORDER BY started_at DESC, call_id DESC LIMIT ?"
    )
    return sql, [*params, f.limit + 1]


CALL_SQL = f"SELECT {_COLUMNS} FROM model_calls WHERE call_id = ?"

# Per task, the caller's turns: every record but the gateway's own, its cache repairs
# (summed apart) and its token counts (no model call: counted nowhere). Sums stay NULL
# where no call reported the field, and the hit ratio's base is the calls that reported
# both prompt and cache.
_TURN = "purpose NOT IN ({})".format(
    ", ".join(f"'{p}'" for p in sorted({REPAIR_PURPOSE, *OWN_RECORD_PURPOSES}))
)
_REPAIR = f"purpose = '{REPAIR_PURPOSE}'"
_BOTH = "prompt_tokens IS NOT NULL AND cached_tokens IS NOT NULL"
TASK_COLUMNS = (
    "task",
    "calls",
    "errors",
    "prompt_tokens",
    "cached_tokens",
    "ratio_prompt",
    "ratio_cached",
    "evaluated_tokens",
    "prefill_ms",
    "repairs",
    "repair_evaluated_tokens",
    "first_call",
    "last_call",
)


# the sums that count (tokens, calls), as whole numbers whatever the database summed them as
_COUNTS = (
    "calls",
    "errors",
    "prompt_tokens",
    "cached_tokens",
    "evaluated_tokens",
    "repairs",
    "repair_evaluated_tokens",
)


def tasks_query(search: str | None, limit: int, like: str = "LIKE") -> tuple[str, list[Any]]:
    """The tasks with the latest calls first, those whose name contains ``search`` (in any
    case: SQLite's ``LIKE`` ignores it, PostgreSQL's ``ILIKE`` does)."""
    params: list[Any] = []
    clause = ""
    if search:
        clause = f" WHERE task {like} ? ESCAPE '\\'"
        params.append("%" + _like_escaped(search) + "%")
    sql = (
        "SELECT task, "
        f"SUM(CASE WHEN {_TURN} THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN {_TURN} AND status <> 'ok' THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN {_TURN} THEN prompt_tokens END), "
        f"SUM(CASE WHEN {_TURN} THEN cached_tokens END), "
        f"SUM(CASE WHEN {_TURN} AND {_BOTH} THEN prompt_tokens END), "
        f"SUM(CASE WHEN {_TURN} AND {_BOTH} THEN cached_tokens END), "
        f"SUM(CASE WHEN {_TURN} THEN evaluated_tokens END), "
        f"SUM(CASE WHEN {_TURN} THEN prefill_ms END), "
        f"SUM(CASE WHEN {_REPAIR} THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN {_REPAIR} THEN evaluated_tokens END), "
        "MIN(started_at), MAX(started_at) "
        f"FROM model_calls{clause} GROUP BY task ORDER BY MAX(started_at) DESC LIMIT ?"
    )
    return sql, [*params, limit]


def misses_query(tasks: list[str]) -> tuple[str, list[Any]]:
    """Each of ``tasks``' misses by cause (the caller's turns only)."""
    marks = ", ".join("?" for _ in tasks)
    sql = (
        "SELECT task, miss_cause, COUNT(*) FROM model_calls "
        f"WHERE task IN ({marks}) AND {_TURN} "
        f"AND miss_cause IS NOT NULL AND miss_cause <> '{NOT_A_MISS}' "
        "GROUP BY task, miss_cause"
    )
    return sql, list(tasks)


def numbered(sql: str) -> str:
    """``sql`` with each ``?`` made ``$1``, ``$2``, … in order (no ``?`` is in a literal)."""
    parts = sql.split("?")
    return "".join(
        part + (f"${i}" if i < len(parts) else "") for i, part in enumerate(parts, start=1)
    )


def calls_page(
    rows: list[dict[str, Any]], f: CallFilter
) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
    """The page of ``calls_query``'s rows, and the cursor of the next (None: the last)."""
    if len(rows) <= f.limit:
        return rows, None
    del rows[f.limit :]
    last = rows[-1]
    return rows, (last["started_at"], last["call_id"])


# runs one statement (``?`` paramstyle) with its parameters and returns its rows
Fetch = Callable[[str, list[Any]], Sequence[Sequence[Any]]]


def tasks_from(
    fetch: Fetch, search: str | None, limit: int, like: str = "LIKE"
) -> list[dict[str, Any]]:
    """Per task its sums and misses, the tasks with the latest calls first: the two
    statements, run by ``fetch`` on whichever database holds the ledger."""
    sql, params = tasks_query(search, limit, like)
    rows = [tuple(row) for row in fetch(sql, params)]
    miss_rows: list[tuple[Any, ...]] = []
    if rows:
        sql, params = misses_query([row[0] for row in rows])
        miss_rows = [tuple(row) for row in fetch(sql, params)]
    return task_summaries(rows, miss_rows)


def task_summaries(
    rows: list[tuple[Any, ...]], miss_rows: list[tuple[Any, ...]]
) -> list[dict[str, Any]]:
    """``tasks_query``'s rows, each with its misses from ``misses_query``'s."""
    misses: dict[str, dict[str, int]] = {row[0]: {} for row in rows}
    for task, cause, count in miss_rows:
        misses[task][cause] = int(count)
    return [task_summary(tuple(row), misses[row[0]]) for row in rows]


def task_summary(row: tuple[Any, ...], misses: dict[str, int]) -> dict[str, Any]:
    """One task's sums as the page shows them, its misses most frequent first."""
    out = dict(zip(TASK_COLUMNS, row, strict=True))
    ratio_prompt, ratio_cached = out.pop("ratio_prompt"), out.pop("ratio_cached")
    out["hit_ratio"] = float(ratio_cached) / float(ratio_prompt) if ratio_prompt else None
    # PostgreSQL sums integers as numeric, times as double precision
    for name in _COUNTS:
        if out[name] is not None:
            out[name] = int(out[name])
    out["misses"] = dict(sorted(misses.items(), key=lambda kv: (-kv[1], kv[0])))
    return out


def _like_escaped(text: str) -> str:
    """``text`` matched as itself by LIKE: its wildcards and the escape escaped."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
