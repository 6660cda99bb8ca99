"""The report as data: the selected rows grouped by task, each with its totals. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from boundedcode_gateway.metering.records import OWN_RECORD_PURPOSES
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE
from boundedcode_gateway.report.rows import CallRow
from boundedcode_gateway.report.totals import TaskTotals, task_totals


@dataclass(frozen=True, slots=True)
class TaskReport:
    """One task: its calls (the per-call table), its repairs (counted apart), its token
    counts (listed apart) and its totals."""

    task: str
    calls: tuple[CallRow, ...]
    repairs: tuple[CallRow, ...]
    totals: TaskTotals
    token_counts: tuple[CallRow, ...] = ()
    # its conversations' slot saves (listed apart)
    saves: tuple[CallRow, ...] = ()


# the purposes of the gateway's own records: never a caller's turn
OWN_PURPOSES = frozenset({REPAIR_PURPOSE, *OWN_RECORD_PURPOSES})


def build_report(rows: Sequence[CallRow], purpose: str | None = None) -> list[TaskReport]:
    """Group ``rows`` by task, in the order each task first appears.

    Repairs (purpose ``cache_repair``) and slot saves (``slot_save``) are the gateway's
    own work, and token counts (purpose ``token_count``) are no model call: none is a
    caller's turn, so all are kept out of a task's calls, the repairs summed apart. A
    report asked for one of these purposes itself (``purpose``) lists its records as the
    calls.
    """
    order: list[str] = []
    by_task: dict[str, list[CallRow]] = {}
    for row in rows:
        if row.task not in by_task:
            order.append(row.task)
            by_task[row.task] = []
        by_task[row.task].append(row)
    reports = []
    for task in order:
        task_rows = by_task[task]
        if purpose in OWN_PURPOSES:
            calls, repairs, counts, saves = task_rows, [], [], []
        else:
            calls = [r for r in task_rows if r.purpose not in OWN_PURPOSES]
            repairs = [r for r in task_rows if r.is_repair]
            counts = [r for r in task_rows if r.is_token_count]
            saves = [r for r in task_rows if r.is_slot_save]
        totals = task_totals(task, calls, repairs)
        reports.append(
            TaskReport(task, tuple(calls), tuple(repairs), totals, tuple(counts), tuple(saves))
        )
    return reports
