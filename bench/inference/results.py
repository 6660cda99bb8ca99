"""The benchmark's report: per workload, the modes side by side per call, and their totals.

Pure: samples in (one dict per call, as ``run.py`` writes them to ``samples.jsonl``),
Markdown out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.inference.modes import IDEAL


@dataclass(frozen=True, slots=True)
class Totals:
    calls: int
    prompt: int
    waited: int  # prompt tokens evaluated while the caller waited
    repair: int  # evaluated by the gateway's cache repair between calls
    wait_ms: float
    tool_call_turns: int
    misses: dict[str, int]

    @property
    def evaluated(self) -> int:
        return self.waited + self.repair


def totals(samples: Sequence[dict[str, Any]]) -> Totals:
    causes = Counter(s["miss_cause"] for s in samples if s.get("miss_cause") not in (None, "none"))
    return Totals(
        calls=len(samples),
        prompt=sum(s["prompt_tokens"] or 0 for s in samples),
        waited=sum(s["evaluated_tokens"] for s in samples),
        repair=sum(s["repair_evaluated"] for s in samples),
        wait_ms=sum(s["wait_ms"] for s in samples),
        tool_call_turns=sum(1 for s in samples if s["tool_calls"]),
        misses=dict(sorted(causes.items())),
    )


def _by_mode(samples: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        out.setdefault(s["mode"], []).append(s)
    return out


def _cell(sample: dict[str, Any] | None) -> str:
    if sample is None:
        return ""
    cell = str(sample["evaluated_tokens"])
    if sample["repair_evaluated"]:
        cell += f" +{sample['repair_evaluated']}"
    cause = sample.get("miss_cause")
    if cause not in (None, "none"):
        cell += f" {cause}"
    return cell


def _ratio(value: int, ideal: int | None) -> str:
    return f"{value / ideal:.2f} x" if ideal else "-"


CHARTS = ("evaluated", "cumulative", "wait")


def workload_section(name: str, samples: Sequence[dict[str, Any]], charts: bool = False) -> str:
    modes = _by_mode(samples)
    names = list(modes)
    lines = [f"## {name}", ""]
    lines.append(
        "Each cell: prompt tokens evaluated while the caller waited, `+N` what the "
        "gateway's cache repair evaluated after that answer (before the next call), and "
        "the call's `miss_cause` where it was not `none`."
    )
    lines.append("")
    lines.append("| step | purpose | turn | " + " | ".join(names) + " |")
    lines.append("|---|---|---|" + "---|" * len(names))
    steps = sorted({s["step"] for s in samples})
    for step in steps:
        row = {m: next((s for s in modes[m] if s["step"] == step), None) for m in names}
        first = next(s for s in row.values() if s is not None)
        mark = " (restart)" if first["restarted"] else ""
        cells = " | ".join(_cell(row[m]) for m in names)
        lines.append(f"| {step}{mark} | {first['purpose']} | {first['turn']} | {cells} |")
    lines += [
        "",
        "| mode | calls | Σprompt | Σevaluated waited | Σrepair | Σevaluated | vs ideal "
        "| Σwait s | turns with tool calls | misses |",
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    all_totals = {m: totals(modes[m]) for m in names}
    ideal = all_totals[IDEAL].evaluated if IDEAL in all_totals else None
    for m in names:
        t = all_totals[m]
        misses = ", ".join(f"{k} {v}" for k, v in t.misses.items()) or "-"
        lines.append(
            f"| {m} | {t.calls} | {t.prompt} | {t.waited} | {t.repair} | {t.evaluated} | "
            f"{_ratio(t.evaluated, ideal)} | {t.wait_ms / 1000:.1f} | {t.tool_call_turns} | "
            f"{misses} |"
        )
    if charts:
        lines.append("")
        lines += [f"![{name}: {c}]({name}-{c}.png)" for c in CHARTS]
    return "\n".join(lines)


def report(samples: Sequence[dict[str, Any]], header: str, charts: bool = False) -> str:
    workloads: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        workloads.setdefault(s["workload"], []).append(s)
    parts = [header, *(workload_section(w, ss, charts) for w, ss in workloads.items())]
    return "\n\n".join(parts) + "\n"
