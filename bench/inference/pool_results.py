"""The pool benchmark's report: each routing policy's totals against the tasks run alone.

Pure (no I/O): the rows are the samples of bench/inference/pool_run.py, each with its
``policy`` (a routing policy, or ``IDEAL`` for the tasks run one by one on a server of
their own) and its ``kind``:

- ``call``: one of a task's calls, as the gateway's call log recorded it (``server``,
  ``evaluated_tokens``, ``cached_tokens``, ``ttft_ms``, ``miss_cause``, ``status``), with
  the caller's ``step`` and ``wait_ms``;
- ``repair``: one of the gateway's cache repairs (purpose ``cache_repair``), the same
  fields; an abandoned one (it gave way to a call) has ``error_code`` ``abandoned`` and no
  token counts;
- ``server``: one server at the end of a run: ``prompt_tokens_total``, what its own
  ``/metrics`` counted as evaluated (every prompt it read, the abandoned repairs' part
  included), and its ``restarts``;
- ``task``: one task's outcome: ``calls_sent`` and its ``error`` (None when it finished).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

IDEAL = "alone"
# the policy the brief's 3x is measured against, when it ran
BASELINE = "round_robin"


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank percentile (``q`` in 0..100) of ``values``; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class PolicyTotals:
    policy: str
    calls: int
    failed_calls: int  # answered with an error (the call log's status)
    evaluated_calls: int  # prompt tokens evaluated for the tasks' calls
    repairs: int  # repairs that ran to the end
    abandoned_repairs: int
    evaluated_repairs: int  # prompt tokens the finished repairs evaluated
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    per_server: dict[str, int]  # calls (not repairs) each server answered
    misses: dict[str, int]  # the calls' miss_cause, ``none`` left out
    server_counted: int | None  # Σ of the servers' prompt_tokens_total (None: unread)
    failed_tasks: tuple[str, ...]

    @property
    def evaluated(self) -> int:
        return self.evaluated_calls + self.evaluated_repairs


def _tokens(row: dict[str, Any]) -> int:
    value = row.get("evaluated_tokens")
    return value if isinstance(value, int) else 0


def policy_totals(rows: Sequence[dict[str, Any]], policy: str) -> PolicyTotals:
    mine = [r for r in rows if r["policy"] == policy]
    calls = [r for r in mine if r["kind"] == "call"]
    repairs = [r for r in mine if r["kind"] == "repair"]
    finished = [r for r in repairs if r.get("status") == "ok"]
    ttfts = [float(r["ttft_ms"]) for r in calls if r.get("ttft_ms") is not None]
    servers = Counter(str(r.get("server")) for r in calls)
    causes = Counter(str(r.get("miss_cause")) for r in calls if r.get("miss_cause") != "none")
    counted = [r.get("prompt_tokens_total") for r in mine if r["kind"] == "server"]
    return PolicyTotals(
        policy=policy,
        calls=len(calls),
        failed_calls=sum(1 for r in calls if r.get("status") != "ok"),
        evaluated_calls=sum(_tokens(r) for r in calls),
        repairs=len(finished),
        abandoned_repairs=sum(1 for r in repairs if r.get("error_code") == "abandoned"),
        evaluated_repairs=sum(_tokens(r) for r in finished),
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p95_ms=percentile(ttfts, 95),
        per_server=dict(sorted(servers.items())),
        misses=dict(sorted(causes.items())),
        server_counted=(
            sum(c for c in counted if isinstance(c, int))
            if counted and all(isinstance(c, int) for c in counted)
            else None
        ),
        failed_tasks=tuple(
            sorted(r["task"] for r in mine if r["kind"] == "task" and r.get("error"))
        ),
    )


def policies(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The policies in the order they ran, the tasks alone first."""
    seen = list(dict.fromkeys(r["policy"] for r in rows))
    return sorted(seen, key=lambda p: p != IDEAL)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(value: int, base: int | None) -> str:
    return f"{value / base:.2f} x" if base else "-"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "-"


TABLE_HEAD = (
    "| policy | calls | Σevaluated calls | Σevaluated repairs (repairs, abandoned) "
    "| Σevaluated | vs ideal | TTFT p50 ms | TTFT p95 ms | calls per server | misses "
    "| server-counted |"
)


def totals_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    every = {p: policy_totals(rows, p) for p in policies(rows)}
    ideal = every[IDEAL].evaluated if IDEAL in every else None
    lines = [TABLE_HEAD, "|---|--:|--:|--:|--:|--:|--:|--:|---|---|--:|"]
    for name, t in every.items():
        counted = "-" if t.server_counted is None else f"{t.server_counted:,}"
        lines.append(
            f"| {name} | {t.calls} | {t.evaluated_calls:,} | {t.evaluated_repairs:,} "
            f"({t.repairs}, {t.abandoned_repairs}) | {t.evaluated:,} | "
            f"{_ratio(t.evaluated, ideal)} | {_ms(t.ttft_p50_ms)} | {_ms(t.ttft_p95_ms)} | "
            f"{_counts(t.per_server)} | {_counts(t.misses)} | {counted} |"
        )
    return lines


def task_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Σevaluated (calls and finished repairs) of each task under each policy."""
    names = policies(rows)
    tasks = sorted(
        {r["task"] for r in rows if r["kind"] in ("call", "task")},
        key=lambda t: (len(t), t),
    )
    sums: Counter[tuple[str, str]] = Counter()
    for r in rows:
        if r["kind"] == "call" or (r["kind"] == "repair" and r.get("status") == "ok"):
            sums[(r["policy"], r["task"])] += _tokens(r)
    lines = ["| task | " + " | ".join(names) + " |", "|---|" + "--:|" * len(names)]
    for task in tasks:
        cells = " | ".join(f"{sums[(p, task)]:,}" for p in names)
        lines.append(f"| {task} | {cells} |")
    return lines


def verdict(rows: Sequence[dict[str, Any]], within: float = 1.25, below: float = 3.0) -> str:
    """Whether affinity came within ``within`` x of the ideal and ``below`` x under round
    robin, in numbers (what cannot be said for want of a policy is said so)."""
    names = policies(rows)
    if "affinity" not in names or IDEAL not in names:
        return "Affinity or the tasks alone did not run: no verdict."
    affinity = policy_totals(rows, "affinity").evaluated
    ideal = policy_totals(rows, IDEAL).evaluated
    parts = [
        f"affinity evaluated {affinity / ideal:.2f} x the ideal "
        f"({'within' if affinity <= within * ideal else 'not within'} {within} x)"
        if ideal
        else "the ideal evaluated nothing"
    ]
    if BASELINE in names:
        baseline = policy_totals(rows, BASELINE).evaluated
        factor = baseline / affinity if affinity else math.inf
        parts.append(
            f"round robin evaluated {factor:.2f} x what affinity did "
            f"({'at least' if factor >= below else 'less than'} {below} x)"
        )
    return "; ".join(parts) + "."


def failures(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per task that did not finish and per call that failed."""
    out = [
        f"- {r['policy']} / {r['task']}: stopped after {r.get('calls_sent', 0)} calls: {r['error']}"
        for r in rows
        if r["kind"] == "task" and r.get("error")
    ]
    out += [
        f"- {r['policy']} / {r['task']} step {r.get('step')}: call log status "
        f"{r.get('status')} ({r.get('error_code')}) on {r.get('server')}"
        for r in rows
        if r["kind"] == "call" and r.get("status") != "ok"
    ]
    return out


EXPLAINED = (
    "Σevaluated: prompt tokens the servers evaluated, from the gateway's call log — the "
    "tasks' calls plus the cache repairs that ran to the end (`cache_repair` records; an "
    "abandoned repair gave way to a call and has no count). `vs ideal`: against the same "
    "tasks each run alone on a fresh server of its own (`alone`). TTFT: the call log's "
    "`ttft_ms` of the tasks' calls (non-streamed: the time to the answer less its decoding "
    "plus one token's, waiting for a slot included). `server-counted`: the sum of the "
    "servers' own `llamacpp:prompt_tokens_total` at the end of the run, every evaluation "
    "included (abandoned repairs' part too). Misses: the calls' `miss_cause` other than "
    "`none`."
)


def report(rows: Sequence[dict[str, Any]], header: str) -> str:
    parts = [header, "## Totals", EXPLAINED, "\n".join(totals_table(rows)), verdict(rows)]
    parts += [
        "## Per task",
        "Σevaluated (calls and repairs) of each task.",
        "\n".join(task_table(rows)),
    ]
    failed = failures(rows)
    if failed:
        parts += ["## Failures", "\n".join(failed)]
    return "\n\n".join(parts) + "\n"
