"""The report's per-task totals. Pure: sums of what the rows carry, nothing recomputed.

"Not reported" stays apart from zero: a sum over calls none of which reported the
field is ``None``, and the hit ratio is taken only over the calls that reported both
``prompt_tokens`` and ``cached_tokens``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from boundedcode_gateway.policy.cache_misses import NOT_A_MISS
from boundedcode_gateway.report.rows import CallRow

__all__ = ["NOT_A_MISS", "TaskTotals", "misses_by_cause", "task_totals"]


@dataclass(frozen=True, slots=True)
class TaskTotals:
    """The totals of one task's calls (``calls``) and of the gateway's repairs (``repair_*``)."""

    task: str
    calls: int
    prompt_tokens: int | None
    cached_tokens: int | None
    # the calls that reported prompt_tokens, and those that reported cached_tokens as well
    # (the hit ratio's base)
    prompt_reported: int
    cached_reported: int
    hit_ratio: float | None
    evaluated_tokens: int | None
    prefill_ms: float | None
    misses: dict[str, int] = field(default_factory=dict)
    repairs: int = 0
    repair_evaluated_tokens: int | None = None


def _sum_int(values: Iterable[int | None]) -> int | None:
    reported = [v for v in values if v is not None]
    return sum(reported) if reported else None


def _sum_float(values: Iterable[float | None]) -> float | None:
    reported = [v for v in values if v is not None]
    return sum(reported) if reported else None


def misses_by_cause(rows: Iterable[CallRow]) -> dict[str, int]:
    """How many calls have each ``miss_cause`` other than ``none``, most frequent first
    (then by name); calls without one are not counted."""
    counts = Counter(r.miss_cause for r in rows if r.miss_cause and r.miss_cause != NOT_A_MISS)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def task_totals(task: str, calls: Sequence[CallRow], repairs: Sequence[CallRow]) -> TaskTotals:
    """The totals of ``calls`` (the caller's turns) and ``repairs`` (purpose ``cache_repair``)."""
    both = [r for r in calls if r.prompt_tokens is not None and r.cached_tokens is not None]
    ratio_prompt = sum(r.prompt_tokens or 0 for r in both)
    ratio_cached = sum(r.cached_tokens or 0 for r in both)
    return TaskTotals(
        task=task,
        calls=len(calls),
        prompt_tokens=_sum_int(r.prompt_tokens for r in calls),
        cached_tokens=_sum_int(r.cached_tokens for r in calls),
        prompt_reported=sum(1 for r in calls if r.prompt_tokens is not None),
        cached_reported=len(both),
        hit_ratio=ratio_cached / ratio_prompt if ratio_prompt > 0 else None,
        evaluated_tokens=_sum_int(r.evaluated_tokens for r in calls),
        prefill_ms=_sum_float(r.prefill_ms for r in calls),
        misses=misses_by_cause(calls),
        repairs=len(repairs),
        repair_evaluated_tokens=_sum_int(r.evaluated_tokens for r in repairs),
    )
