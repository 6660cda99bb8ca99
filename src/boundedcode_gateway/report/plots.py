"""The report's charts: three PNG files per task, drawn with matplotlib (the ``report`` extra).

matplotlib is imported only when charts are asked for, and drawn on its Agg canvas
directly (no pyplot, no display, no global backend switch). Per task:

- ``<task>-tokens.png``: per call, stacked cached / evaluated / generated tokens, each
  miss (a ``miss_cause`` other than ``none``) marked above its bar and labelled with
  its cause, and each failed call labelled ``error``;
- ``<task>-ttft.png``: the time to first token per call;
- ``<task>-prefill.png``: the prefill time summed over the calls.

The calls are the caller's turns, as in the report's table (repairs are not drawn).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from boundedcode_gateway.report.build import TaskReport
from boundedcode_gateway.report.rows import CallRow
from boundedcode_gateway.report.totals import NOT_A_MISS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install 'boundedcode-gateway[report]'"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_COLOURS = {"cached": "#4c9f70", "evaluated": "#d9822b", "generated": "#4a78b5", "miss": "#c23b22"}


class PlotsUnavailable(Exception):
    """matplotlib is not installed; the message says how to install it."""


def require_matplotlib() -> None:
    """Raise ``PlotsUnavailable`` unless matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotsUnavailable(
            f"--plots needs matplotlib, which is not installed: {INSTALL_HINT}"
        ) from None


def tick_labels(calls: Sequence[CallRow]) -> list[str]:
    """Each call's turn; prefixed with its purpose when the task has several."""
    if len({r.purpose for r in calls}) > 1:
        return [f"{r.purpose} {r.turn}" for r in calls]
    return [str(r.turn) for r in calls]


def _new_figure(calls: Sequence[CallRow], title: str, ylabel: str) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure

    width = min(max(6.0, 0.45 * len(calls) + 2.0), 30.0)
    fig = Figure(figsize=(width, 4.8), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("turn")
    ax.set_ylabel(ylabel)
    labels = tick_labels(calls)
    upright = len(calls) > 12 or max((len(x) for x in labels), default=0) > 4
    ax.set_xticks(range(len(calls)), labels, rotation=90 if upright else 0)
    ax.grid(axis="y", alpha=0.3)
    return fig, ax


def _save(fig: Figure, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)  # attaches itself to the figure
    fig.savefig(path, format="png")
    return path


def _tokens_chart(report: TaskReport, path: Path) -> Path:
    calls = report.calls
    fig, ax = _new_figure(calls, f"{report.task}: tokens per call", "tokens")
    xs = list(range(len(calls)))
    cached = [r.cached_tokens or 0 for r in calls]
    evaluated = [r.evaluated_tokens or 0 for r in calls]
    generated = [r.completion_tokens or 0 for r in calls]
    ax.bar(xs, cached, color=_COLOURS["cached"], label="cached")
    ax.bar(xs, evaluated, bottom=cached, color=_COLOURS["evaluated"], label="evaluated")
    under = [c + e for c, e in zip(cached, evaluated, strict=True)]
    ax.bar(xs, generated, bottom=under, color=_COLOURS["generated"], label="generated")
    top = max([u + g for u, g in zip(under, generated, strict=True)] or [0]) or 1
    missed = False
    for x, row, u, g in zip(xs, calls, under, generated, strict=True):
        if row.miss_cause is None or row.miss_cause == NOT_A_MISS:
            continue
        y = u + g + 0.02 * top
        ax.plot([x], [y], marker="v", color=_COLOURS["miss"], label=None if missed else "miss")
        ax.annotate(
            row.miss_cause,
            (x, y),
            xytext=(0, 6),
            textcoords="offset points",
            rotation=90,
            ha="center",
            va="bottom",
            fontsize=8,
            color=_COLOURS["miss"],
        )
        missed = True
    for x, row in zip(xs, calls, strict=True):
        if row.status != "ok":
            # "error", or "abandoned" for a cache repair that gave way (not a failure)
            ax.annotate(
                "abandoned" if row.status == "abandoned" else "error",
                (x, 0),
                xytext=(0, 4),
                textcoords="offset points",
                rotation=90,
                ha="center",
                va="bottom",
                fontsize=8,
                color="grey",
            )
    ax.set_ylim(0, top * 1.35)
    ax.legend(loc="upper left")
    return _save(fig, path)


def _ttft_chart(report: TaskReport, path: Path) -> Path:
    calls = report.calls
    fig, ax = _new_figure(calls, f"{report.task}: time to first token", "TTFT (ms)")
    ttft = [math.nan if r.ttft_ms is None else r.ttft_ms for r in calls]
    ax.plot(range(len(calls)), ttft, marker="o", color=_COLOURS["generated"])
    ax.set_ylim(bottom=0)
    return _save(fig, path)


def _prefill_chart(report: TaskReport, path: Path) -> Path:
    calls = report.calls
    fig, ax = _new_figure(calls, f"{report.task}: cumulative prefill time", "prefill (s)")
    total = 0.0
    cumulative = []
    for r in calls:
        total += (r.prefill_ms or 0.0) / 1000
        cumulative.append(total)
    ax.step(range(len(calls)), cumulative, where="mid", color=_COLOURS["evaluated"])
    ax.set_ylim(bottom=0)
    return _save(fig, path)


def write_plots(reports: Sequence[TaskReport], directory: Path) -> list[Path]:
    """Write the three charts of each task that has calls; return the files written.

    Raises ``PlotsUnavailable`` without matplotlib.
    """
    require_matplotlib()
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for report in reports:
        if not report.calls:
            continue
        stem = _UNSAFE.sub("_", report.task)
        written.append(_tokens_chart(report, directory / f"{stem}-tokens.png"))
        written.append(_ttft_chart(report, directory / f"{stem}-ttft.png"))
        written.append(_prefill_chart(report, directory / f"{stem}-prefill.png"))
    return written
