"""Samples of one lane on one target in one round, and the medians over rounds."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.overhead.loadgen import LoadResult


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


@dataclass(frozen=True)
class Sample:
    round: int
    lane: str
    target: str
    ok: int
    errors: int
    error_sample: str
    p50_ms: float
    p99_ms: float
    first_p50_ms: float
    first_p99_ms: float
    rps: float
    cpu_ms_per_req: float

    @classmethod
    def of(cls, rnd: int, lane: str, target: str, res: LoadResult, cpu_s: float) -> Sample:
        return cls(
            round=rnd,
            lane=lane,
            target=target,
            ok=res.ok,
            errors=res.errors,
            error_sample=res.error_sample,
            p50_ms=percentile(res.latency_ms, 50),
            p99_ms=percentile(res.latency_ms, 99),
            first_p50_ms=percentile(res.first_ms, 50),
            first_p99_ms=percentile(res.first_ms, 99),
            rps=res.rps(),
            cpu_ms_per_req=cpu_s * 1000 / res.ok if res.ok else float("nan"),
        )


class Results:
    """All samples of a run; medians over rounds, "added" taken against direct per round."""

    def __init__(self, samples: Sequence[Sample]) -> None:
        self.samples = list(samples)
        self._by: dict[tuple[str, str], list[Sample]] = {}
        for s in self.samples:
            self._by.setdefault((s.lane, s.target), []).append(s)

    def has(self, lane: str, target: str) -> bool:
        return any(s.ok for s in self._by.get((lane, target), []))

    def median(self, lane: str, target: str, metric: str) -> float:
        values = [getattr(s, metric) for s in self._by.get((lane, target), []) if s.ok]
        return statistics.median(values) if values else float("nan")

    def added(self, lane: str, target: str, metric: str) -> float:
        """Median over rounds of (target - direct) in the same round."""
        direct = {s.round: getattr(s, metric) for s in self._by.get((lane, "direct"), []) if s.ok}
        diffs = [
            getattr(s, metric) - direct[s.round]
            for s in self._by.get((lane, target), [])
            if s.ok and s.round in direct
        ]
        return statistics.median(diffs) if diffs else float("nan")

    def errors(self, target: str) -> tuple[int, str]:
        found = [s for s in self.samples if s.target == target]
        sample = next((s.error_sample for s in found if s.error_sample), "")
        return sum(s.errors for s in found), sample
