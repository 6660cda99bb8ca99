"""The report as text: Markdown, CSV or JSON. Pure: strings from ``TaskReport`` lists.

Markdown is for reading (one table of calls per task, then one table of totals);
CSV holds one table, the calls or the totals; JSON holds everything, the repairs' and
the token counts' own rows included. Numbers are printed as recorded; sums of times
are rounded to the microsecond and ratios to six places so that the output does not
depend on the order of float additions.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from boundedcode_gateway.metering.records import SLOT_SAVE_PURPOSE, TOKEN_COUNT_PURPOSE
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE
from boundedcode_gateway.report.build import TaskReport
from boundedcode_gateway.report.rows import CallRow
from boundedcode_gateway.report.totals import TaskTotals
from boundedcode_gateway.text import printable

# (CallRow field, Markdown header); CSV and JSON use the field names
CALL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("turn", "turn"),
    ("purpose", "purpose"),
    ("status", "status"),
    ("prompt_tokens", "prompt"),
    ("cached_tokens", "cached"),
    ("evaluated_tokens", "evaluated"),
    ("completion_tokens", "completion"),
    ("reasoning_tokens", "reasoning"),
    ("ttft_ms", "ttft_ms"),
    ("prefill_ms", "prefill_ms"),
    ("decode_ms", "decode_ms"),
    ("total_ms", "total_ms"),
    ("changed", "changed"),
    ("miss_cause", "miss_cause"),
    ("restored_tokens", "restored"),
)
# CSV and JSON: the call's task and start as well
CSV_CALL_FIELDS: tuple[str, ...] = ("task", "started_at", *(f for f, _ in CALL_COLUMNS))
TOTAL_FIELDS: tuple[str, ...] = (
    "task",
    "calls",
    "prompt_tokens",
    "cached_tokens",
    "prompt_reported",
    "cached_reported",
    "hit_ratio",
    "evaluated_tokens",
    "prefill_ms",
    "misses",
    "repairs",
    "repair_evaluated_tokens",
)
TOTAL_HEADERS: tuple[str, ...] = (
    "task",
    "calls",
    "Σprompt",
    "Σcached",
    "hit ratio",
    "Σevaluated",
    "Σprefill_ms",
    "misses",
    "repairs",
    "repair evaluated",
)
NOT_REPORTED = "not reported"
NO_CALLS = "(no calls)"
# columns whose Markdown cells are right-aligned (numbers)
_TEXT_HEADERS = frozenset({"purpose", "status", "miss_cause", "task", "misses"})


def _round(value: float | None, places: int) -> float | None:
    return None if value is None else round(value, places)


def totals_dict(totals: TaskTotals) -> dict[str, Any]:
    """The totals as plain values, in ``TOTAL_FIELDS`` order (JSON's ``totals``)."""
    return {
        "task": totals.task,
        "calls": totals.calls,
        "prompt_tokens": totals.prompt_tokens,
        "cached_tokens": totals.cached_tokens,
        "prompt_reported": totals.prompt_reported,
        "cached_reported": totals.cached_reported,
        "hit_ratio": _round(totals.hit_ratio, 6),
        "evaluated_tokens": totals.evaluated_tokens,
        "prefill_ms": _round(totals.prefill_ms, 3),
        "misses": dict(totals.misses),
        "repairs": totals.repairs,
        "repair_evaluated_tokens": totals.repair_evaluated_tokens,
    }


def call_dict(row: CallRow) -> dict[str, Any]:
    """One row as plain values, in ``CSV_CALL_FIELDS`` order."""
    return {name: getattr(row, name) for name in CSV_CALL_FIELDS}


# -- Markdown


def _md_cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return printable(str(value)).replace("|", "\\|")


def _md_table(headers: Sequence[str], lines: Sequence[Sequence[str]]) -> list[str]:
    align = ["---" if h in _TEXT_HEADERS else "---:" for h in headers]
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    out.extend("| " + " | ".join(cells) + " |" for cells in lines)
    return out


def format_hit_ratio(totals: TaskTotals) -> str:
    """``87.5 %``; with its base named when only some of the calls that reported prompt
    tokens reported cached tokens; ``not reported`` when none did (never ``0 %``)."""
    if totals.hit_ratio is None:
        return NOT_REPORTED
    text = f"{100 * totals.hit_ratio:.1f} %"
    if totals.cached_reported < totals.prompt_reported:
        text += f" ({totals.cached_reported} of {totals.prompt_reported} calls)"
    return text


def format_misses(misses: Mapping[str, int]) -> str:
    """``history_rewrite 2, first_call 1``; ``-`` without misses."""
    return ", ".join(f"{cause} {n}" for cause, n in misses.items()) or "-"


def _totals_cells(totals: TaskTotals) -> list[str]:
    prefill = _round(totals.prefill_ms, 3)
    return [
        _md_cell(totals.task),
        str(totals.calls),
        _md_cell(totals.prompt_tokens),
        _md_cell(totals.cached_tokens),
        format_hit_ratio(totals),
        _md_cell(totals.evaluated_tokens),
        _md_cell(prefill),
        format_misses(totals.misses),
        str(totals.repairs),
        _md_cell(totals.repair_evaluated_tokens),
    ]


def render_markdown(reports: Sequence[TaskReport]) -> str:
    """One section per task with its calls, then the totals of every task."""
    out = ["# Call report", ""]
    if not reports:
        return "\n".join([*out, NO_CALLS, ""])
    for report in reports:
        out.extend([f"## Task `{printable(report.task)}`", ""])
        if report.calls:
            lines = [[_md_cell(getattr(r, f)) for f, _ in CALL_COLUMNS] for r in report.calls]
            out.extend(_md_table([h for _, h in CALL_COLUMNS], lines))
        else:
            out.append(NO_CALLS)
        if report.repairs:
            evaluated = _md_cell(report.totals.repair_evaluated_tokens)
            out.extend(
                [
                    "",
                    f"{len(report.repairs)} cache repairs (purpose `{REPAIR_PURPOSE}`, "
                    f"not in the table) evaluated {evaluated} tokens.",
                ]
            )
        if report.saves:
            out.extend(
                [
                    "",
                    f"{len(report.saves)} slot saves (purpose `{SLOT_SAVE_PURPOSE}`, "
                    "its conversations' slots written to their slot files, not in the table).",
                ]
            )
        if report.token_counts:
            out.extend(
                [
                    "",
                    f"{len(report.token_counts)} token counts (purpose `{TOKEN_COUNT_PURPOSE}`, "
                    "no model call, not in the table).",
                ]
            )
        out.append("")
    out.extend(["## Totals", ""])
    out.extend(_md_table(TOTAL_HEADERS, [_totals_cells(r.totals) for r in reports]))
    out.append("")
    return "\n".join(out)


# -- CSV


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        value = ";".join(f"{k}={v}" for k, v in value.items())
    return printable(str(value))


def _csv(fields: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(fields)
    for row in rows:
        writer.writerow([_csv_value(row[f]) for f in fields])
    return buffer.getvalue()


def render_csv_calls(reports: Sequence[TaskReport]) -> str:
    """One line per call (repairs and token counts left out, as in Markdown); empty cell =
    not reported."""
    return _csv(CSV_CALL_FIELDS, [call_dict(r) for rep in reports for r in rep.calls])


def render_csv_totals(reports: Sequence[TaskReport]) -> str:
    """One line per task; ``misses`` as ``cause=n;cause=n``; empty cell = not reported."""
    return _csv(TOTAL_FIELDS, [totals_dict(rep.totals) for rep in reports])


# -- JSON


def render_json(reports: Sequence[TaskReport], filters: Mapping[str, Any]) -> str:
    """Everything: the filters, and per task its calls, its repairs, its token counts
    and its totals (``null`` = not reported)."""
    document = {
        "filters": dict(filters),
        "tasks": [
            {
                "task": rep.task,
                "calls": [call_dict(r) for r in rep.calls],
                "repairs": [call_dict(r) for r in rep.repairs],
                "token_counts": [call_dict(r) for r in rep.token_counts],
                "slot_saves": [call_dict(r) for r in rep.saves],
                "totals": totals_dict(rep.totals),
            }
            for rep in reports
        ],
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n"
