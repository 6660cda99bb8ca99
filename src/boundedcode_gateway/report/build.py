"""The report as data: the selected rows grouped by task, each with its totals. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from boundedcode_gateway.report.rows import CallRow
from boundedcode_gateway.report.totals import TaskTotals, task_totals


@dataclass(frozen=True, slots=True)
class TaskReport:
    """One task: its calls (the per-call table), its repairs (counted apart) and its totals."""

    task: str
    calls: tuple[CallRow, ...]
    repairs: tuple[CallRow, ...]
    totals: TaskTotals


def build_report(rows: Sequence[CallRow], repairs_as_calls: bool = False) -> list[TaskReport]:
    """Group ``rows`` by task, in the order each task first appears.

    Repairs (purpose ``cache_repair``) are the gateway's own work, not the caller's
    turns: they are kept out of a task's calls and summed apart. ``repairs_as_calls``
    (a report asked for the purpose ``cache_repair`` itself) lists them as the calls.
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
        if repairs_as_calls:
            calls, repairs = task_rows, []
        else:
            calls = [r for r in task_rows if not r.is_repair]
            repairs = [r for r in task_rows if r.is_repair]
        reports.append(
            TaskReport(task, tuple(calls), tuple(repairs), task_totals(task, calls, repairs))
        )
    return reports
