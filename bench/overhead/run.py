"""The benchmark run: start the fake and the targets, measure every lane in rounds, print the table.

Targets are measured one after another within each lane, their order rotated
every round, so that a change in the machine's load spreads over all of them.
Whatever was started is stopped by PID in a ``finally``, whatever failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import orjson
import uvloop

from bench.overhead import procs, profile, table
from bench.overhead.http_client import build_request
from bench.overhead.lanes import Lane, body_for, check_for, full_lanes
from bench.overhead.loadgen import run_load
from bench.overhead.results import Results, Sample
from bench.overhead.targets import ALL_TARGETS, BENCH_DIR, PEERS, STARTERS, Env, Running

SMOKE_TARGETS = ("direct", "gateway")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__)
    p.add_argument("--targets", default=",".join(ALL_TARGETS), help="comma-separated")
    p.add_argument("--lanes", default="", help="comma-separated lane keys (default: all)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0, help="bound of each measurement")
    p.add_argument("--smoke", action="store_true", help="direct and gateway only, ~10 s in all")
    p.add_argument("--json", type=Path, help="also write every sample to this file")
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs, configs)")
    p.add_argument("--profile", metavar="LANE", help="then sample the gateway under LANE (py-spy)")
    p.add_argument("--profile-target", default="gateway", help="the target --profile samples")
    return p


def _versions(names: Sequence[str]) -> list[str]:
    out = [f"python {platform.python_version()}", f"kernel {platform.release()}"]
    try:
        from importlib.metadata import version

        out.append(f"boundedcode-gateway {version('boundedcode-gateway')}")
        if "litellm" in names:
            out.append(f"litellm {version('litellm')}")
    except Exception:
        pass
    if "portkey" in names:
        pkg = BENCH_DIR / "node_modules/@portkey-ai/gateway/package.json"
        if pkg.exists():
            out.append(f"portkey-gateway {orjson.loads(pkg.read_bytes())['version']}")
        node = shutil.which("node")
        if node:
            out.append(
                "node "
                + subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
            )
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


async def _measure(lane: Lane, target: Running, rnd: int) -> Sample:
    route = target.routes[lane.kind]
    direct = target.name == "direct"
    body = body_for(lane, route, direct)
    request = build_request("127.0.0.1", target.port, route.path, body, route.headers)
    pid = target.proc.pid if target.proc else None
    cpu0 = procs.tree_cpu_s(pid) if pid else 0.0
    res = await run_load(
        "127.0.0.1",
        target.port,
        request,
        check_for(lane, direct),
        lane.concurrency,
        lane.max_requests,
        lane.max_seconds,
    )
    cpu = (procs.tree_cpu_s(pid) - cpu0) if pid else float("nan")
    return Sample.of(rnd, lane.key, target.name, res, cpu)


async def _rounds(
    lanes: Sequence[Lane], running: Sequence[Running], rounds: int, log: bool
) -> list[Sample]:
    samples: list[Sample] = []
    for rnd in range(rounds):
        for lane in lanes:
            order = list(running[rnd % len(running) :]) + list(running[: rnd % len(running)])
            for target in order:
                if lane.kind not in target.routes:
                    continue
                s = await _measure(lane, target, rnd)
                samples.append(s)
                if log:
                    print(
                        f"  round {rnd + 1} {lane.key:9} {target.name:16} ok={s.ok:<6} "
                        f"err={s.errors:<4} p50={s.p50_ms:.3f} ms rps={s.rps:,.0f}",
                        file=sys.stderr,
                        flush=True,
                    )
    return samples


async def _profiled(lane: Lane, target: Running, work: Path, core: int | None) -> str:
    """One more measurement of ``lane`` on ``target`` with py-spy sampling it."""
    if target.proc is None:
        return f"profile: {target.name} is not a process of its own"
    raw = work / "profile.txt"
    spy = profile.start(target.proc.pid, lane.max_seconds + 1.0, raw, core)
    try:
        await asyncio.sleep(0.5)  # py-spy attaches
        await _measure(lane, target, 0)
        await asyncio.to_thread(spy.wait, lane.max_seconds + 30)
    finally:
        if spy.poll() is None:
            spy.kill()
            spy.wait()
    if not raw.exists():
        return "profile: py-spy wrote nothing (is ptrace allowed here?)"
    return f"profile of {target.name} under {lane.key}:\n" + profile.summary(raw)


def _start_fake(work: Path, core: int | None) -> tuple[procs.Proc, int]:
    port = procs.free_port()
    argv = [sys.executable, "-m", "bench.overhead.fake_upstream", "--port", str(port)]
    proc = procs.start("fake", argv, core, work, cwd=BENCH_DIR.parent)
    procs.wait_listening(proc, port, 20)
    return proc, port


def _start_targets(names: Sequence[str], env: Env, started: list[procs.Proc]) -> list[Running]:
    """Start each target (a peer that cannot start is left out, with a note on stderr)."""
    running: list[Running] = []
    for name in names:
        try:
            target = STARTERS[name](env)
        except (RuntimeError, FileNotFoundError) as exc:
            if name not in PEERS:
                raise
            print(f"{name}: not measured: {exc}", file=sys.stderr)
            continue
        if target.proc is not None:
            started.append(target.proc)
        running.append(target)
    return running


def _lanes(opts: argparse.Namespace, seconds: float) -> list[Lane]:
    lanes = full_lanes(seconds)
    if opts.lanes:
        wanted = set(opts.lanes.split(","))
        lanes = [lane for lane in lanes if lane.key in wanted]
    return lanes


def run(argv: Sequence[str] | None = None) -> int:
    opts = _parser().parse_args(argv)
    names = list(SMOKE_TARGETS) if opts.smoke else [t for t in opts.targets.split(",") if t]
    unknown = [n for n in names if n not in STARTERS]
    if unknown:
        print(f"unknown targets: {', '.join(unknown)}", file=sys.stderr)
        return 2
    seconds = 0.3 if opts.smoke else opts.seconds
    rounds = 1 if opts.smoke else opts.rounds
    lanes = _lanes(opts, seconds)

    load_core, target_core = procs.cores()
    if load_core is not None:
        os.sched_setaffinity(0, {load_core})  # the load generator shares the fake's core
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    started: list[procs.Proc] = []
    env: Env | None = None
    profiled = ""
    load_before = procs.loadavg()
    began = time.monotonic()
    try:
        fake, fake_port = _start_fake(work, load_core)
        started.append(fake)
        env = Env(fake_port, target_core, work)
        running = _start_targets(names, env, started)
        samples = uvloop.run(_rounds(lanes, running, rounds, log=not opts.smoke))
        if opts.profile:
            lane = next(x for x in full_lanes(seconds) if x.key == opts.profile)
            target = next(t for t in running if t.name == opts.profile_target)
            profiled = uvloop.run(_profiled(lane, target, work, load_core))
    finally:
        for proc in reversed(started):
            procs.stop(proc)
        for cleanup in env.cleanups if env is not None else []:
            cleanup()
        if not opts.keep:
            shutil.rmtree(work, ignore_errors=True)
    load_after = procs.loadavg()

    measured = [t.name for t in running]
    lane_notes = {
        t.name: {
            lane.key: note for lane in lanes for kind, note in t.notes.items() if lane.kind == kind
        }
        for t in running
    }
    header = [
        f"overhead benchmark: {rounds} round(s) x {seconds:g} s per lane, medians over rounds;"
        f" {os.cpu_count()} cores ({_cpu_model()}); target on core {target_core},"
        f" fake + load generator on core {load_core}",
        "versions: " + ", ".join(_versions(measured)),
        f"load before: {load_before}; after: {load_after};"
        f" run took {time.monotonic() - began:.0f} s",
        "",
    ]
    print("\n".join(header))
    _report(Results(samples), measured, lane_notes, [lane.key for lane in lanes])
    if profiled:
        print()
        print(profiled)
    if opts.json:
        opts.json.write_bytes(
            orjson.dumps([asdict(s) for s in samples], option=orjson.OPT_INDENT_2)
        )
    return 0


def _report(
    results: Results, measured: list[str], notes: dict[str, dict[str, str]], lanes: list[str]
) -> None:
    print(table.render(results, measured, notes, lanes))
    goal_lanes = {g.lane for g in table.GOALS}
    if any(p in measured for p in PEERS) and goal_lanes & set(lanes):
        print()
        print(table.render_goals(results, lanes))
