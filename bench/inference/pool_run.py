"""The pool benchmark's runs: T agent tasks at once through the gateway over N servers it runs.

Each routing policy runs on a fresh gateway (so fresh servers: every cache empty), the
gateway itself starting the N llama-servers of the profile (``replicas: N``). The
ideal is each task run alone, one after the other, on a fresh gateway of one server
with the same ``server:`` settings.

Each task is one thread sending the workload's calls one after another, as an agent
does: ``reasoning_history: auto`` and a caller that drops ``reasoning_content`` (as
``gateway-auto``). The tasks share the workload (its system prompt after the first
line, its tools, its inputs) and the model; each has its own task id
(``X-BoundedCode-Task``), its own first line of the system prompt (``TASK_LINE``, so
no two tasks' prompts share a token past the template's opening) and its own seed.
Between an answer and its next call a task waits ``tool_time_s``: the time an agent
spends running its tool, in which the gateway's cache repair may run.

What was evaluated comes from the gateway's call log; at the end of a run each
server's own ``/metrics`` counter is read as well (the servers' ports from the
gateway's ``/ui/api/models``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import real_server
from bench.inference.caller import Caller
from bench.inference.pool_results import IDEAL
from bench.inference.workload import Workload
from boundedcode_gateway.metering.records import OWN_RECORD_PURPOSES
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE

# the caller waits this much longer than the gateway waits for the server
CALL_MARGIN_S = 60.0
PROFILE = "local"
TASK_LINE = "You are working on checkout {n} of the repository."
# after the last answer, the call log is read once no record came for this long (the
# last answers' repairs), waiting at most QUIET_MAX_S
QUIET_S = 5.0
QUIET_MAX_S = 60.0


@dataclass(frozen=True, slots=True)
class PoolSettings:
    model: str
    template: Path
    reasoning_budget: int
    max_tokens: int | None  # None: the workload's
    temperature: float
    seed: int  # task n sends seed + n
    servers: int
    tasks: int
    parallel: int  # slots per server
    ctx_size: int  # per server, shared by its slots
    cache_ram_mib: int
    threads: int  # per server
    tool_time_s: float
    run_timeout_s: float  # each gateway run: one policy, or one task alone
    read_timeout_s: float  # the gateway's inference.read_timeout_s


def task_workload(workload: Workload, n: int) -> Workload:
    """Task ``n`` of the run: its own task id and ``TASK_LINE`` first in each system prompt."""
    line = TASK_LINE.format(n=n)
    purposes = {
        name: dataclasses.replace(p, system=f"{line}\n\n{p.system}")
        for name, p in workload.purposes.items()
    }
    return dataclasses.replace(workload, task=f"{workload.task}-{n}", purposes=purposes)


def task_seed(settings: PoolSettings, n: int) -> int:
    return settings.seed + n


def gateway_config(data_dir: Path, settings: PoolSettings, routing: str | None) -> Path:
    """A gateway with one managed ``local`` profile: ``settings.servers`` replicas routed by
    ``routing``, or (``routing`` None) a single server."""
    server: dict[str, Any] = {
        "parallel": settings.parallel,
        "ctx_size": settings.ctx_size,
        "cache_ram_mib": settings.cache_ram_mib,
        "threads": settings.threads,
        "chat_template_file": str(settings.template),
        "extra_args": ["--reasoning-budget", str(settings.reasoning_budget), "--metrics"],
    }
    local: dict[str, Any] = {
        "provider": "local",
        "model_path": settings.model,
        "reasoning_history": "auto",
        "server": server,
    }
    if routing is not None:
        local.update(replicas=settings.servers, routing=routing)
    config = data_dir / "gateway.yaml"
    # calls queue behind a full re-evaluation for as long as the run needs: no limit on a
    # whole call, as before the gateway had one by default
    inference = {"read_timeout_s": settings.read_timeout_s, "max_call_s": None}
    whole = {"data_dir": str(data_dir), "inference": inference, "models": {PROFILE: local}}
    config.write_text(yaml.safe_dump(whole))
    return config


@dataclass(slots=True)
class TaskRun:
    """One task's thread: what it sent, and why it stopped early (None: it finished)."""

    workload: Workload
    seed: int
    sent: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


def _body(messages: list[dict[str, Any]], tools: list[Any], s: PoolSettings, run: TaskRun) -> Any:
    body: dict[str, Any] = {
        "model": PROFILE,
        "messages": messages,
        "max_tokens": s.max_tokens or run.workload.max_tokens,
        "temperature": s.temperature,
        "seed": run.seed,
    }
    if tools:
        body["tools"] = tools
    return body


def _run_task(
    url: str, run: TaskRun, settings: PoolSettings, deadline: float, stop: threading.Event
) -> None:
    caller = Caller(run.workload, keep_reasoning=False)
    with httpx.Client(timeout=settings.read_timeout_s + CALL_MARGIN_S) as client:
        while not caller.done:
            if stop.is_set() or time.monotonic() > deadline:
                run.error = "the run's time was up"
                return
            request = caller.next_request()
            body = _body(request.messages, request.tools, settings, run)
            headers = {
                "X-BoundedCode-Task": run.workload.task,
                "X-BoundedCode-Purpose": request.purpose,
            }
            started = time.perf_counter()
            try:
                resp = client.post(url + "/v1/chat/completions", json=body, headers=headers)
            except httpx.HTTPError as exc:
                run.error = f"step {request.step.index}: {exc!r}"
                return
            wait_ms = (time.perf_counter() - started) * 1000
            if resp.status_code != 200:
                run.error = f"step {request.step.index}: HTTP {resp.status_code}: {resp.text[:500]}"
                return
            choice = resp.json()["choices"][0]
            caller.record_answer(choice["message"])
            run.sent.append(
                {
                    "step": request.step.index,
                    "wait_ms": round(wait_ms, 1),
                    "finish_reason": choice.get("finish_reason"),
                    "tool_calls": len(choice["message"].get("tool_calls") or []),
                }
            )
            if settings.tool_time_s > 0 and stop.wait(settings.tool_time_s):
                run.error = "the run's time was up"
                return


def _run_tasks(url: str, runs: Sequence[TaskRun], settings: PoolSettings) -> None:
    """Every task at once, one thread each, until all are done or the run's time is up."""
    deadline = time.monotonic() + settings.run_timeout_s
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=_run_task,
            args=(url, run, settings, deadline, stop),
            name=run.workload.task,
            daemon=True,
        )
        for run in runs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stop.set()


def _wait_quiet(data_dir: Path) -> None:
    """Until the call log has had no new record for ``QUIET_S`` (at most ``QUIET_MAX_S``)."""
    end = time.monotonic() + QUIET_MAX_S
    seen, since = -1, time.monotonic()
    while time.monotonic() < end:
        count = len(real_server.calls(data_dir))
        if count != seen:
            seen, since = count, time.monotonic()
        elif time.monotonic() - since >= QUIET_S:
            return
        time.sleep(0.25)


def _metric(text: str, name: str) -> int | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[1]))
    return None


def _server_counters(url: str) -> list[dict[str, Any]]:
    """Each server of the profile: its name, restarts and ``llamacpp:prompt_tokens_total``."""
    out: list[dict[str, Any]] = []
    with httpx.Client(timeout=30) as client:
        models = client.get(url + "/ui/api/models").json()["models"]
        local = next(m for m in models if m["name"] == PROFILE)
        for server in local["servers"]:
            port = server.get("port")
            total = None
            if port and server.get("state") == "ready":
                text = client.get(f"http://127.0.0.1:{port}/metrics").text
                total = _metric(text, "llamacpp:prompt_tokens_total")
            out.append(
                {
                    "kind": "server",
                    "server": server["name"],
                    "restarts": server.get("restarts"),
                    "prompt_tokens_total": total,
                }
            )
    return out


RECORD_KEYS = (
    "task",
    "purpose",
    "server",
    "status",
    "error_code",
    "started_at",
    "prompt_tokens",
    "cached_tokens",
    "evaluated_tokens",
    "completion_tokens",
    "ttft_ms",
    "miss_cause",
    "reusable_tokens",
)


def rows_of_run(
    policy: str, records: Sequence[dict[str, Any]], runs: Sequence[TaskRun]
) -> list[dict[str, Any]]:
    """The samples of one gateway run: its call log's records of the tasks (each call beside
    what its caller saw, in the order sent) and each task's outcome."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        task = run.workload.task
        mine = sorted((r for r in records if r["task"] == task), key=lambda r: r["started_at"])
        calls: list[dict[str, Any]] = []
        for record in mine:
            if record["purpose"] in OWN_RECORD_PURPOSES:
                continue  # the gateway's own work for the task (a slot save): no call
            repair = record["purpose"] == REPAIR_PURPOSE
            row: dict[str, Any] = {"policy": policy, "kind": "repair" if repair else "call"}
            row.update({k: record.get(k) for k in RECORD_KEYS})
            rows.append(row)
            if not repair:
                calls.append(row)
        for row, sent in zip(calls, run.sent, strict=False):
            row.update(step=sent["step"], wait_ms=sent["wait_ms"], tool_calls=sent["tool_calls"])
        error = run.error
        if error is None and len(calls) != len(run.sent):
            error = f"{len(run.sent)} calls answered, {len(calls)} in the call log"
        outcome = {"policy": policy, "kind": "task", "task": task}
        rows.append({**outcome, "calls_sent": len(run.sent), "error": error})
    return rows


def run_gateway(
    policy: str,
    workloads: Sequence[Workload],
    settings: PoolSettings,
    run_dir: Path,
    routing: str | None,
) -> list[dict[str, Any]]:
    """``workloads`` at once through a fresh gateway (``routing`` None: one server)."""
    _set_aside(run_dir)
    data_dir = run_dir / "gateway"
    data_dir.mkdir(parents=True)
    config = gateway_config(data_dir, settings, routing)
    runs = [TaskRun(w, task_seed(settings, _number(w))) for w in workloads]
    with real_server.gateway(config, run_dir, name=f"gateway-{policy}") as url:
        _run_tasks(url, runs, settings)
        _wait_quiet(data_dir)
        servers = _server_counters(url)
    rows = rows_of_run(policy, real_server.calls(data_dir), runs)
    return rows + [{"policy": policy, **s} for s in servers]


def _set_aside(run_dir: Path) -> None:
    """An interrupted run's folder (its logs) is kept beside the new run's, renamed."""
    if not run_dir.exists():
        return
    for n in range(1, 1000):
        aside = run_dir.with_name(f"{run_dir.name}.interrupted-{n}")
        if not aside.exists():
            run_dir.rename(aside)
            return
    raise RuntimeError(f"{run_dir}: too many interrupted runs kept")


def _number(workload: Workload) -> int:
    return int(workload.task.rsplit("-", 1)[1])


def finished_runs(rows: Sequence[dict[str, Any]]) -> set[tuple[str, str | None]]:
    """The runs ``rows`` hold whole: (``IDEAL``, task) for each task run alone, (policy,
    None) for each policy (a run's rows are written together, once it ended)."""
    return {
        (r["policy"], r["task"] if r["policy"] == IDEAL else None)
        for r in rows
        if r["kind"] == "task"
    }


def run_benchmark(
    workload: Workload,
    settings: PoolSettings,
    policies: Sequence[str],
    out: Path,
    sink: Callable[[list[dict[str, Any]]], None],
    earlier: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Each task alone, then every task at once under each policy; each run's rows go to
    ``sink`` as it ends. The runs ``earlier`` holds (an interrupted run's samples) are not
    run again: their rows are returned with the new ones."""
    tasks = [task_workload(workload, n) for n in range(1, settings.tasks + 1)]
    done = finished_runs(earlier)
    rows = list(earlier)
    for task in tasks:
        if (IDEAL, task.task) in done:
            continue
        print(f"{IDEAL}: {task.task} ...", flush=True)
        got = run_gateway(IDEAL, [task], settings, out / "runs" / IDEAL / task.task, None)
        sink(got)
        rows += got
    for policy in policies:
        if (policy, None) in done:
            continue
        print(f"{policy}: {settings.tasks} tasks over {settings.servers} servers ...", flush=True)
        got = run_gateway(policy, tasks, settings, out / "runs" / policy, policy)
        sink(got)
        rows += got
    return rows
