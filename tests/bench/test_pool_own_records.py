"""The pool benchmark's join of the call log: the gateway's own records of a task (its slot
saves) are no calls of the task."""

from __future__ import annotations

from typing import Any

from bench.inference.pool_run import TaskRun, rows_of_run, task_workload
from bench.inference.workload import load_workload


def test_a_slot_save_of_the_task_is_no_call_of_it() -> None:
    workload = task_workload(load_workload("tool-loop"), 1)
    run = TaskRun(workload, 8)
    run.sent = [{"step": 1, "wait_ms": 10.0, "tool_calls": 0, "finish_reason": "length"}]
    task = workload.task
    records: list[dict[str, Any]] = [
        {"task": task, "purpose": "agent_turn", "started_at": "T0", "evaluated_tokens": 900},
        {"task": task, "purpose": "slot_save", "started_at": "T1", "evaluated_tokens": None},
        {"task": task, "purpose": "cache_repair", "started_at": "T2", "evaluated_tokens": 6},
    ]
    rows = rows_of_run("affinity", records, [run])
    assert [(r["kind"], r.get("evaluated_tokens")) for r in rows] == [
        ("call", 900),
        ("repair", 6),
        ("task", None),
    ]
    assert rows[-1]["error"] is None
