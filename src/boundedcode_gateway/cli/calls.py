"""The ``calls`` subcommand: show recent metered calls as a plain-text table.

Owns the table's columns and formatting; it reads the ledger (read-only) or the
call log and must not write to either.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from boundedcode_gateway.locations import LedgerLocation, describe, explain
from boundedcode_gateway.metering.calllog import read_calls
from boundedcode_gateway.metering.ledgers import LEDGER_ERRORS, ledger_at, ledger_exists
from boundedcode_gateway.text import printable

# (record field, header, right-aligned)
COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("started_at", "started", False),
    ("task", "task", False),
    ("purpose", "purpose", False),
    ("front", "front", False),
    ("model_profile", "model", False),
    ("status", "status", False),
    ("http_status", "http", True),
    # the gateway's code (`unsupported_field`, `upstream_stream_broken`), not only a status
    ("error_code", "error", False),
    ("prompt_tokens", "prompt", True),
    ("cached_tokens", "cached", True),
    ("evaluated_tokens", "evaluated", True),
    ("completion_tokens", "completion", True),
    ("ttft_ms", "ttft_ms", True),
    ("total_ms", "total_ms", True),
    ("messages", "msgs", True),
    ("changed", "changed", True),
    ("retried", "retried", False),
    ("attempts", "attempts", True),
)
NO_CALLS = "(no calls)"
COLUMN_GAP = "  "


def format_cell(value: Any) -> str:
    """One value as the table shows it: ``-`` for None, floats with one decimal, control
    characters escaped (a task or model name is whatever a caller sent)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return printable(str(value))


def format_calls_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as an aligned table under a header line; ``(no calls)`` when empty."""
    cells = [[format_cell(row.get(field)) for field, _, _ in COLUMNS] for row in rows]
    widths = [len(header) for _, header, _ in COLUMNS]
    for line in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, line, strict=True)]

    def render(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if right else v.ljust(w)
            for v, w, (_, _, right) in zip(values, widths, COLUMNS, strict=True)
        ]
        return COLUMN_GAP.join(parts).rstrip()

    lines = [render([header for _, header, _ in COLUMNS])]
    if cells:
        lines.extend(render(line) for line in cells)
    else:
        lines.append(NO_CALLS)
    return "\n".join(lines)


def run_calls(ledger: LedgerLocation, calls_path: Path, task: str | None, last: int) -> int:
    """Print the newest ``last`` calls (of ``task`` if given); the ledger first, else the log."""
    rows: list[dict[str, Any]] | None = None
    if ledger_exists(ledger):
        try:
            rows = _read_ledger(ledger, task, last)
        except LEDGER_ERRORS as exc:
            print(
                f"cannot read the ledger {describe(ledger)}: {explain(ledger, exc)}; "
                f"reading {calls_path}",
                file=sys.stderr,
            )
    if rows is None:
        rows = read_calls(calls_path, task=task, last=last)
    print(format_calls_table(rows))
    return 0


def _read_ledger(location: LedgerLocation, task: str | None, last: int) -> list[dict[str, Any]]:
    ledger = ledger_at(location)
    ledger.open(read_only=True)
    try:
        return ledger.recent(task, last)
    finally:
        ledger.close()
