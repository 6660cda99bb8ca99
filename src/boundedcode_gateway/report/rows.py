"""The report's rows: the call log's lines as typed rows, numbered into turns and filtered.

Pure: it takes the call log's decoded lines (``metering.calllog.read_calls``) and must
not read files or recompute anything the gateway recorded (``miss_cause`` is read as
written).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from boundedcode_gateway.metering.records import SLOT_SAVE_PURPOSE, TOKEN_COUNT_PURPOSE
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE

# the gateway's own follow-up work after a llama.cpp answer (llama_server/cache_keeper.py);
# shown apart from the caller's turns


@dataclass(frozen=True, slots=True)
class CallRow:
    """One call of the log as the report shows it; ``None`` where the call did not report it."""

    task: str
    purpose: str
    turn: int  # 1-based index of the call within its (task, purpose), in start order
    started_at: str
    status: str
    prompt_tokens: int | None
    cached_tokens: int | None
    evaluated_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    ttft_ms: float | None
    prefill_ms: float | None
    decode_ms: float | None
    total_ms: float | None
    changed: int | None
    miss_cause: str | None
    # tokens of its conversation's slot file restored into its slot (llama-server.md)
    restored_tokens: int | None = None

    @property
    def is_repair(self) -> bool:
        return self.purpose == REPAIR_PURPOSE

    @property
    def is_token_count(self) -> bool:
        return self.purpose == TOKEN_COUNT_PURPOSE

    @property
    def is_slot_save(self) -> bool:
        return self.purpose == SLOT_SAVE_PURPOSE


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _str(value: Any, default: str) -> str:
    return value if isinstance(value, str) else default


def number_turns(calls: Iterable[Mapping[str, Any]]) -> list[CallRow]:
    """The calls as rows in start order, each numbered within its (task, purpose).

    The log is written as calls end, so it is sorted by ``started_at`` first (stable:
    calls that started in the same millisecond keep the log's order). Number the whole
    log of a task before filtering, so that a turn keeps its number under any filter.
    """
    ordered = sorted(calls, key=lambda c: _str(c.get("started_at"), ""))
    seen: dict[tuple[str, str], int] = {}
    rows: list[CallRow] = []
    for call in ordered:
        task = _str(call.get("task"), "default")
        purpose = _str(call.get("purpose"), "agent_turn")
        turn = seen.get((task, purpose), 0) + 1
        seen[(task, purpose)] = turn
        rows.append(
            CallRow(
                task=task,
                purpose=purpose,
                turn=turn,
                started_at=_str(call.get("started_at"), ""),
                status=_str(call.get("status"), "error"),
                prompt_tokens=_int(call.get("prompt_tokens")),
                cached_tokens=_int(call.get("cached_tokens")),
                evaluated_tokens=_int(call.get("evaluated_tokens")),
                completion_tokens=_int(call.get("completion_tokens")),
                reasoning_tokens=_int(call.get("reasoning_tokens")),
                ttft_ms=_float(call.get("ttft_ms")),
                prefill_ms=_float(call.get("prefill_ms")),
                decode_ms=_float(call.get("decode_ms")),
                total_ms=_float(call.get("total_ms")),
                changed=_int(call.get("changed")),
                miss_cause=call.get("miss_cause")
                if isinstance(call.get("miss_cause"), str)
                else None,
                restored_tokens=_int(call.get("restored_tokens")),
            )
        )
    return rows


def parse_since(text: str) -> datetime:
    """``--since``: an ISO 8601 date or time; without a zone it is UTC.

    Raises ``ValueError`` with the text when it is not one.
    """
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--since {text!r} is not an ISO 8601 date or time") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _started(row: CallRow) -> datetime | None:
    try:
        return parse_since(row.started_at)
    except ValueError:
        return None


def select_rows(
    rows: Iterable[CallRow], purpose: str | None = None, since: datetime | None = None
) -> list[CallRow]:
    """The rows of ``purpose`` (if given) that started at or after ``since`` (if given).

    A row whose start time does not parse is kept only without ``since``.
    """
    kept: list[CallRow] = []
    for row in rows:
        if purpose is not None and row.purpose != purpose:
            continue
        if since is not None:
            started = _started(row)
            if started is None or started < since:
                continue
        kept.append(row)
    return kept
