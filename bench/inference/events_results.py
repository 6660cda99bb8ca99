"""The events benchmark's report: per event, each mode's cost of the calls after the event,
its whole run, and the ratios of ``slot-files`` to the modes beside it in the same run.

Pure: rows in (one dict per call, as ``events_run.py`` writes them to ``samples.jsonl``;
an ``error`` row for a run that failed), Markdown out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import mean
from typing import Any

from bench.inference.events import EVENTS, LITELLM, MODES, NO_SLOT_FILES, SLOT_FILES

CHART = "events-{event}.png"
RATIOS = ((SLOT_FILES, NO_SLOT_FILES), (SLOT_FILES, LITELLM))


@dataclass(frozen=True, slots=True)
class ModeSummary:
    """One mode's run of one event."""

    mode: str
    calls: int
    after_calls: int  # calls measured as after the event
    after_evaluated: float | None  # prompt tokens evaluated, a call after the event
    after_ttft_ms: float | None  # time to first token, a call after the event
    evaluated: int  # over the run's calls, while their caller waited
    repair: int  # by the gateway's cache repair between calls
    restored: int  # tokens restored from slot files before the calls after the event
    answer_tokens: float | None = None  # generated, an agent turn
    error: str | None = None

    @property
    def total(self) -> int:
        return self.evaluated + self.repair


def _mean(values: Sequence[float | int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return mean(known) if known else None


def summarize(rows: Sequence[dict[str, Any]]) -> ModeSummary:
    """The summary of one run: its rows (calls, or one error)."""
    mode = rows[0]["mode"]
    errors = [r["error"] for r in rows if r["kind"] == "error"]
    calls = [r for r in rows if r["kind"] != "error"]
    after = [r for r in calls if r["after_event"]]
    return ModeSummary(
        mode=mode,
        calls=len(calls),
        after_calls=len(after),
        after_evaluated=_mean([r["evaluated_tokens"] for r in after]),
        after_ttft_ms=_mean([r["ttft_ms"] for r in after]),
        evaluated=sum(r["evaluated_tokens"] or 0 for r in calls),
        repair=sum(r["repair_evaluated"] or 0 for r in calls),
        restored=sum(r.get("restored_tokens") or 0 for r in after),
        answer_tokens=_mean([r["completion_tokens"] for r in calls if r["kind"] == "agent"]),
        error=errors[0] if errors else None,
    )


def by_event(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, ModeSummary]]:
    """Each event's runs, its modes in the benchmark's order."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in rows:
        runs.setdefault(r["event"], {}).setdefault(r["mode"], []).append(r)
    order = {m: i for i, m in enumerate(MODES)}
    return {
        event: {m: summarize(modes[m]) for m in sorted(modes, key=lambda m: order.get(m, 99))}
        for event, modes in runs.items()
    }


def ratio(mine: float | None, theirs: float | None) -> str:
    if mine is None or not theirs:
        return "-"
    return f"{mine / theirs:.2f}"


def _n(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def ratio_rows(summaries: dict[str, ModeSummary]) -> list[str]:
    """``| slot-files / X | evaluated after | TTFT after | Σ evaluated |``, per mode beside."""
    lines = []
    for mine, theirs in RATIOS:
        a, b = summaries.get(mine), summaries.get(theirs)
        if a is None or b is None or a.error or b.error:
            continue
        lines.append(
            f"| {mine} / {theirs} | {ratio(a.after_evaluated, b.after_evaluated)} | "
            f"{ratio(a.after_ttft_ms, b.after_ttft_ms)} | {ratio(a.total, b.total)} |"
        )
    return lines


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return ""
    cell = f"{_n(row['evaluated_tokens'])} · {_n(row['ttft_ms'])} ms"
    if row.get("restored_tokens"):
        cell += f" · restored {row['restored_tokens']:,}"
    cause = row.get("miss_cause")
    if cause not in (None, "none"):
        cell += f" · {cause}"
    if row.get("restore_failure"):
        cell += f" · {row['restore_failure']}"
    if row.get("note"):
        cell += f" · {row['note']}"
    return cell


def calls_table(rows: Sequence[dict[str, Any]], modes: Sequence[str]) -> list[str]:
    """One line per call of the run, the modes side by side."""
    calls = [r for r in rows if r["kind"] != "error"]
    lines = [
        "| call | task | kind | turn | " + " | ".join(modes) + " |",
        "|---|---|---|---|" + "---|" * len(modes),
    ]
    for seq in sorted({r["seq"] for r in calls}):
        row = {
            m: next((r for r in calls if r["mode"] == m and r["seq"] == seq), None) for m in modes
        }
        first = next(r for r in row.values() if r is not None)
        mark = " (after the event)" if first["event_before"] else ""
        cells = " | ".join(_cell(row[m]) for m in modes)
        lines.append(
            f"| {seq}{mark} | {first['task_n']} | {first['kind']} | {first['turn']} | {cells} |"
        )
    return lines


def event_section(
    event: str, rows: Sequence[dict[str, Any]], summaries: dict[str, ModeSummary], charts: bool
) -> str:
    known = EVENTS.get(event)
    lines = [f"## {event}", ""]
    if known is not None:
        lines += [known.what[0].upper() + known.what[1:] + ".", ""]
    lines += [
        "| mode | calls | calls after the event | evaluated after the event | TTFT after the "
        "event, ms | restored after the event | Σ evaluated (waited + repair) | agent "
        "answer, tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m, s in summaries.items():
        if s.error:
            lines.append(f"| {m} | failed: {s.error} | | | | | | |")
            continue
        lines.append(
            f"| {m} | {s.calls} | {s.after_calls} | {_n(s.after_evaluated)} | "
            f"{_n(s.after_ttft_ms)} | {s.restored:,} | {s.total:,} ({s.evaluated:,} + "
            f"{s.repair:,}) | {_n(s.answer_tokens)} |"
        )
    ratios = ratio_rows(summaries)
    if ratios:
        lines += [
            "",
            "| ratio | evaluated after the event | TTFT after the event | Σ evaluated |",
            "|---|---:|---:|---:|",
            *ratios,
        ]
    lines += [
        "",
        "Evaluated and TTFT after the event: a call's, the mean where several calls count "
        "(crowded: each task's turns after the first round; side requests: the agent's "
        "turns after them). Agent answer: the mean tokens generated in the agent's turns, "
        "reasoning included.",
        "",
        "Each call: prompt tokens evaluated · time to first token, then what was restored "
        "from a slot file, the call's `miss_cause` where not `none` and its "
        "`restore_failure`.",
        "",
        *calls_table(rows, list(summaries)),
    ]
    if charts:
        lines += ["", f"![{event}: evaluated and TTFT per call]({CHART.format(event=event)})"]
    return "\n".join(lines)


def summary_table(events: dict[str, dict[str, ModeSummary]]) -> list[str]:
    """Per event, the calls after it in each mode, and the ratios."""
    lines = [
        "| event | evaluated after: slot-files / no-slot-files / litellm | TTFT after, ms: "
        "slot-files / no-slot-files / litellm | ratio to no-slot-files (evaluated, TTFT) | "
        "ratio to litellm (evaluated, TTFT) |",
        "|---|---|---|---|---|",
    ]
    for event, summaries in events.items():
        ok = {m: s for m, s in summaries.items() if not s.error}

        def cells(value: str, ok: dict[str, ModeSummary] = ok) -> str:
            return " / ".join(
                _n(getattr(ok[m], value)) if m in ok else "-"
                for m in (SLOT_FILES, NO_SLOT_FILES, LITELLM)
            )

        ratios = []
        for mine, theirs in RATIOS:
            a, b = ok.get(mine), ok.get(theirs)
            if a is None or b is None:
                ratios.append("-")
                continue
            ratios.append(
                f"{ratio(a.after_evaluated, b.after_evaluated)}, "
                f"{ratio(a.after_ttft_ms, b.after_ttft_ms)}"
            )
        lines.append(
            f"| {event} | {cells('after_evaluated')} | {cells('after_ttft_ms')} | "
            f"{ratios[0]} | {ratios[1]} |"
        )
    return lines


def report(rows: Sequence[dict[str, Any]], header: str, charts: bool = False) -> str:
    events = by_event(rows)
    parts = [header, "\n".join(["## Summary", "", *summary_table(events)])]
    for event, summaries in events.items():
        mine = [r for r in rows if r["event"] == event]
        parts.append(event_section(event, mine, summaries, charts))
    return "\n\n".join(parts) + "\n"
