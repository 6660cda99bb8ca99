"""How fast calls are recorded, and what the ledger's kind costs a call: the overhead
benchmark's c=16 lane (small streamed calls to its fake upstream, metering on) through

- one gateway with its SQLite ledger (the default),
- one gateway with its ledger in PostgreSQL,
- two gateways on one PostgreSQL ledger, each taking c=16 at once.

Each mode runs for ``--seconds`` per round, the modes taking turns within each round;
then every call answered must be one row of its ledger (counted, and the difference
printed). A fresh PostgreSQL database (on 127.0.0.1:5432, user ``postgres``) is made
for each PostgreSQL mode and dropped after. Prints one table: calls per second (all
gateways together), p50 and p99 latency, and rows written against calls answered.

Run: ``python -m bench.ledger_rate [--rounds N] [--seconds S]`` (``make bench-ledger-rate``).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from bench.overhead import payloads, procs
from bench.overhead.http_client import Timing
from bench.overhead.loadgen import run_load
from bench.overhead.results import percentile

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
CONCURRENCY = 16
MAX_REQUESTS = 1_000_000
STARTUP_TIMEOUT_S = 60.0
# until every record is in the ledger after the load
SETTLE_S = 30.0
MODES = ("1 gateway, SQLite", "1 gateway, PostgreSQL", "2 gateways, PostgreSQL")


@dataclass
class Sample:
    rps: float
    p50_ms: float
    p99_ms: float
    answered: int
    rows: int


def _check(t: Timing) -> str | None:
    if t.status != 200 or not t.body.endswith(b"data: [DONE]\n\n"):
        return f"HTTP {t.status}: {t.body[-200:]!r}"
    return None


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(ADMIN_URL, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _pg_rows(url: str) -> int:
    conn = await asyncpg.connect(url, timeout=5)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM model_calls"))
    finally:
        await conn.close()


def _config(path: Path, data_dir: Path, fake_port: int, ledger: str | None) -> Path:
    lines = [f"data_dir: {data_dir}"]
    if ledger is not None:
        lines.append(f"ledger: {ledger}")
    lines += [
        "models:",
        f"  {payloads.MODEL}:",
        "    provider: openai-compatible",
        f"    base_url: http://127.0.0.1:{fake_port}/v1",
        "    api_key_env: BENCH_UPSTREAM_KEY",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


async def _mode(mode: str, work: Path, fake_port: int, seconds: float) -> Sample:
    gateways = 2 if mode.startswith("2") else 1
    database = None
    ledger = None
    if "PostgreSQL" in mode:
        database = f"bench_ledger_{secrets.token_hex(4)}"
        await _admin(f'CREATE DATABASE "{database}"')
        ledger = f"postgresql://postgres@127.0.0.1:5432/{database}"
    running: list[tuple[procs.Proc, int, Path]] = []
    try:
        for i in range(gateways):
            data_dir = work / f"{database or 'sqlite'}-{i}-{secrets.token_hex(2)}"
            config = _config(work / f"{data_dir.name}.yaml", data_dir, fake_port, ledger)
            port = procs.free_port()
            argv = [sys.executable, "-m", "boundedcode_gateway", "serve", "--config", str(config)]
            env = {"BENCH_UPSTREAM_KEY": "sk-bench-not-secret"}
            proc = procs.start(data_dir.name, [*argv, "--port", str(port)], None, work, env)
            running.append((proc, port, data_dir))
            procs.wait_listening(proc, port, STARTUP_TIMEOUT_S)
        body = payloads.small_body(payloads.MODEL, stream=True)
        request = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode() + body
        loads = await asyncio.gather(
            *(
                run_load("127.0.0.1", port, request, _check, CONCURRENCY, MAX_REQUESTS, seconds)
                for _, port, _ in running
            )
        )
        # warm-up calls (three per connection) are answered and recorded too
        answered = sum(r.ok + r.errors for r in loads) + 3 * CONCURRENCY * gateways
        rows = await _rows_once_settled(ledger, running, answered)
        latencies = [x for r in loads for x in r.latency_ms]
        return Sample(
            rps=sum(r.rps() for r in loads),
            p50_ms=percentile(latencies, 50),
            p99_ms=percentile(latencies, 99),
            answered=answered,
            rows=rows,
        )
    finally:
        for proc, _, _ in running:
            procs.stop(proc)
        if database is not None:
            await _admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


async def _rows_once_settled(
    ledger: str | None, running: list[tuple[procs.Proc, int, Path]], answered: int
) -> int:
    deadline = time.monotonic() + SETTLE_S
    while True:
        if ledger is not None:
            rows = await _pg_rows(ledger)
        else:
            rows = 0
            for _, _, data_dir in running:
                with sqlite3.connect(data_dir / "ledger.db") as db:
                    rows += int(db.execute("SELECT count(*) FROM model_calls").fetchone()[0])
        if rows >= answered or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.2)


def _table(results: dict[str, list[Sample]]) -> str:
    lines = [
        "| mode | calls/s (all gateways) | p50 ms | p99 ms | calls answered | rows written |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        rs = results[mode]
        lines.append(
            f"| {mode} | {statistics.median(s.rps for s in rs):.0f} | "
            f"{statistics.median(s.p50_ms for s in rs):.2f} | "
            f"{statistics.median(s.p99_ms for s in rs):.2f} | "
            f"{sum(s.answered for s in rs)} | {sum(s.rows for s in rs)} |"
        )
    return "\n".join(lines)


async def _run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="ledger-rate-") as tmp:
        work = Path(tmp)
        fake_port = procs.free_port()
        fake = procs.start(
            "fake",
            [sys.executable, "-m", "bench.overhead.fake_upstream", "--port", str(fake_port)],
            None,
            work,
        )
        try:
            procs.wait_listening(fake, fake_port, STARTUP_TIMEOUT_S)
            results: dict[str, list[Sample]] = {mode: [] for mode in MODES}
            for rnd in range(args.rounds):
                for mode in MODES[rnd % 3 :] + MODES[: rnd % 3]:
                    results[mode].append(await _mode(mode, work, fake_port, args.seconds))
                    print(f"round {rnd + 1} {mode}: done", file=sys.stderr)
            print(
                f"c={CONCURRENCY} per gateway, small streamed calls, {args.seconds:g} s per mode "
                f"and round, {args.rounds} rounds (medians over rounds; sums of calls and rows)\n"
            )
            print(_table(results))
        finally:
            procs.stop(fake)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger_rate")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    return asyncio.run(_run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
