"""The ``report`` subcommand: a call log as per-call rows and per-task totals, and charts.

Owns reading the log, applying the filters and choosing the output; the rows, totals
and renderings are in ``boundedcode_gateway.report``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from boundedcode_gateway.metering.calllog import read_calls
from boundedcode_gateway.report.build import build_report
from boundedcode_gateway.report.render import (
    render_csv_calls,
    render_csv_totals,
    render_json,
    render_markdown,
)
from boundedcode_gateway.report.rows import number_turns, parse_since, select_rows

FORMATS = ("md", "json", "csv")
TABLES = ("calls", "totals")
EXIT_REPORT = 1


def run_report(
    calls_path: Path,
    task: str | None = None,
    purpose: str | None = None,
    since: str | None = None,
    fmt: str = "md",
    table: str = "calls",
    plots: Path | None = None,
) -> int:
    """Print the report of ``calls_path`` on stdout; write the charts into ``plots`` if given.

    A bad ``--since`` or missing matplotlib is one line on stderr and exit code 1, before
    anything is printed.
    """
    try:
        since_at = parse_since(since) if since is not None else None
    except ValueError as exc:
        print(f"boundedcode-gateway report: {exc}", file=sys.stderr)
        return EXIT_REPORT
    if plots is not None:
        from boundedcode_gateway.report.plots import PlotsUnavailable, require_matplotlib

        try:
            require_matplotlib()
        except PlotsUnavailable as exc:
            print(f"boundedcode-gateway report: {exc}", file=sys.stderr)
            return EXIT_REPORT
    # turns are numbered over the whole log of the task, so a filter keeps their numbers
    rows = select_rows(number_turns(read_calls(calls_path, task=task)), purpose, since_at)
    reports = build_report(rows, purpose)
    if fmt == "json":
        text = render_json(reports, {"task": task, "purpose": purpose, "since": since})
    elif fmt == "csv":
        text = render_csv_totals(reports) if table == "totals" else render_csv_calls(reports)
    else:
        text = render_markdown(reports)
    sys.stdout.write(text)
    if plots is not None:
        from boundedcode_gateway.report.plots import write_plots

        for path in write_plots(reports, plots):
            print(f"wrote {path}", file=sys.stderr)
    return 0
