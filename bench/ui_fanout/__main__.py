"""What a viewer of the page of calls costs the calls: 200 concurrent streamed calls
through the gateway with no viewer, with a viewer that reads its event stream, and with
one that never reads it (a connection that sent its request and then stalls, its receive
buffer small, as a frozen browser tab's would be). The reading viewer is a process of its
own (``bench/ui_fanout/viewer.py``), so its reading takes no time of the load generator's.

The gateway and the fake upstream of the overhead benchmark run as processes on
loopback; the modes take turns within each round so that drift of the machine falls on
all of them alike. Prints one table (the medians over rounds, and what each mode adds to
"no viewer") and the events the stalled viewer was not sent. Every loop is bounded in
requests and in time.

Run: ``python -m bench.ui_fanout [--rounds N] [--requests N] [--concurrency N]``
(``make bench-ui-fanout``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from bench.overhead import payloads, procs
from bench.overhead.http_client import Timing
from bench.overhead.loadgen import LoadResult, run_load
from bench.overhead.results import percentile

MODES = ("no viewer", "reading viewer", "stalled viewer")
STARTUP_TIMEOUT_S = 60.0
# a stalled viewer's receive buffer: a frozen tab's socket fills, then the gateway's sends wait
STALLED_RCVBUF = 4096
_DROPPED = re.compile(rb"^boundedcode_gateway_ui_dropped_events_total (\S+)$", re.M)


def _config(work: Path, fake_port: int) -> Path:
    path = work / "gateway.yaml"
    path.write_text(
        "\n".join(
            [
                f"data_dir: {work / 'data'}",
                "models:",
                f"  {payloads.MODEL}:",
                "    provider: local",
                f"    external_url: http://127.0.0.1:{fake_port}",
                "    server: {cache_repair: false}",
            ]
        )
        + "\n"
    )
    return path


def _check(t: Timing) -> str | None:
    if t.status != 200 or not t.body.endswith(b"data: [DONE]\n\n"):
        return f"HTTP {t.status}: {t.body[-200:]!r}"
    return None


@contextlib.contextmanager
def _stalled_viewer(port: int) -> Iterator[None]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STALLED_RCVBUF)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /ui/api/events HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
    try:
        yield None
    finally:
        sock.close()


async def _round(
    port: int, mode: str, args: argparse.Namespace, body: bytes, work: Path
) -> LoadResult:
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body

    async def load() -> LoadResult:
        return await run_load(
            "127.0.0.1", port, request, _check, args.concurrency, args.requests, args.seconds
        )

    if mode == "no viewer":
        return await load()
    if mode == "stalled viewer":
        with _stalled_viewer(port):
            await asyncio.sleep(0.2)
            return await load()
    argv = [sys.executable, "-m", "bench.ui_fanout.viewer", "--port", str(port)]
    viewer = procs.start("viewer", argv, None, work)
    try:
        await asyncio.sleep(0.5)
        return await load()
    finally:
        procs.stop(viewer)


def _dropped(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        found = _DROPPED.search(resp.read())
    return float(found.group(1)) if found else float("nan")


def _table(results: dict[str, list[LoadResult]]) -> str:
    def med(mode: str, q: float, first: bool = False) -> float:
        return statistics.median(
            percentile(r.first_ms if first else r.latency_ms, q) for r in results[mode]
        )

    base50, base95 = med("no viewer", 50), med("no viewer", 95)
    lines = [
        "| mode | calls | errors | p50 ms | p95 ms | first chunk p50 ms "
        "| added p50 ms | added p95 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        rs = results[mode]
        p50, p95 = med(mode, 50), med(mode, 95)
        lines.append(
            f"| {mode} | {sum(r.ok for r in rs)} | {sum(r.errors for r in rs)} | {p50:.2f} | "
            f"{p95:.2f} | {med(mode, 50, first=True):.2f} | {p50 - base50:+.2f} | "
            f"{p95 - base95:+.2f} |"
        )
    return "\n".join(lines)


async def _run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="ui-fanout-") as tmp:
        work = Path(tmp)
        fake_port, port = procs.free_port(), procs.free_port()
        fake = procs.start(
            "fake",
            [sys.executable, "-m", "bench.overhead.fake_upstream", "--port", str(fake_port)],
            None,
            work,
        )
        gateway = None
        try:
            procs.wait_listening(fake, fake_port, STARTUP_TIMEOUT_S)
            argv = [sys.executable, "-m", "boundedcode_gateway", "serve"]
            argv += ["--config", str(_config(work, fake_port)), "--port", str(port)]
            gateway = procs.start("gateway", argv, None, work)
            procs.wait_listening(gateway, port, STARTUP_TIMEOUT_S)
            body = payloads.small_body(payloads.MODEL, stream=True)
            results: dict[str, list[LoadResult]] = {mode: [] for mode in MODES}
            for rnd in range(args.rounds):
                order = MODES[rnd % 3 :] + MODES[: rnd % 3]
                for mode in order:
                    results[mode].append(await _round(port, mode, args, body, work))
                    print(f"round {rnd + 1} {mode}: done", file=sys.stderr)
            print(
                f"{args.concurrency} concurrent streamed calls, {args.requests} per mode and "
                f"round, {args.rounds} rounds (medians over rounds)\n"
            )
            print(_table(results))
            print(f"\nevents not sent to the stalled viewer (dropped): {_dropped(port):.0f}")
        finally:
            for proc in (gateway, fake):
                if proc is not None:
                    procs.stop(proc)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ui_fanout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=4000, help="calls per mode and round")
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0, help="bound of one mode's load")
    started = time.monotonic()
    code = asyncio.run(_run(parser.parse_args(argv)))
    print(f"({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
