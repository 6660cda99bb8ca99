"""The load generator: N closed-loop workers, each on its own kept-alive connection.

Every loop is bounded twice, by a request count and by a deadline, so a slow or
stuck target ends the lane instead of the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.overhead.http_client import Connection, Timing

# a request not answered in this long counts as an error and ends that worker
REQUEST_TIMEOUT_S = 10.0
WARM_PER_CONNECTION = 3


@dataclass(slots=True)
class LoadResult:
    """What one lane saw: per-request times in ms, errors, the wall time of the loop."""

    latency_ms: list[float] = field(default_factory=list)
    first_ms: list[float] = field(default_factory=list)
    errors: int = 0
    error_sample: str = ""
    wall_s: float = 0.0

    @property
    def ok(self) -> int:
        return len(self.latency_ms)

    def rps(self) -> float:
        return self.ok / self.wall_s if self.wall_s > 0 else 0.0


Check = Callable[[Timing], str | None]  # an error message, or None when the answer is right


async def _worker(
    conn: Connection,
    request: bytes,
    check: Check,
    budget: list[int],
    deadline: float,
    out: LoadResult,
) -> None:
    while budget[0] > 0 and time.perf_counter() < deadline:
        budget[0] -= 1
        try:
            t = await asyncio.wait_for(conn.send(request), REQUEST_TIMEOUT_S)
        except (OSError, TimeoutError, ConnectionError, Exception) as exc:
            out.errors += 1
            out.error_sample = out.error_sample or f"{type(exc).__name__}: {exc}"
            conn.close()
            if isinstance(exc, TimeoutError):
                return
            continue
        problem = check(t)
        if problem is not None:
            out.errors += 1
            out.error_sample = out.error_sample or problem
            continue
        out.latency_ms.append((t.done - t.sent) / 1e6)
        out.first_ms.append((t.first - t.sent) / 1e6)


async def run_load(
    host: str,
    port: int,
    request: bytes,
    check: Check,
    concurrency: int,
    max_requests: int,
    max_seconds: float,
) -> LoadResult:
    """Send ``request`` from ``concurrency`` workers until ``max_requests`` or ``max_seconds``."""
    conns = [Connection(host, port) for _ in range(concurrency)]
    out = LoadResult()
    budget = [max_requests]
    try:
        # connections opened and each path warmed before the clock starts (not counted)
        warm = LoadResult()
        warm_budget = [concurrency * WARM_PER_CONNECTION]
        warm_deadline = time.perf_counter() + min(2.0, max_seconds)
        await asyncio.gather(
            *(_worker(c, request, check, warm_budget, warm_deadline, warm) for c in conns)
        )
        start = time.perf_counter()
        deadline = start + max_seconds
        await asyncio.gather(*(_worker(c, request, check, budget, deadline, out) for c in conns))
        out.wall_s = time.perf_counter() - start
    finally:
        for c in conns:
            c.close()
    return out
