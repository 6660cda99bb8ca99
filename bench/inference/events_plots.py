"""The events benchmark's charts, one per event with its modes overlaid (matplotlib, Agg):
above, the prompt tokens each call evaluated; below, its time to first token; the
event's action a dashed line before the call it preceded, each call measured as after
the event a larger marker, each side request a cross.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.inference.events import MODES
from bench.inference.events_results import CHART


def write_plot(event: str, rows: Sequence[dict[str, Any]], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    calls = [r for r in rows if r["kind"] != "error"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    order = {m: i for i, m in enumerate(MODES)}
    modes = sorted({r["mode"] for r in calls}, key=lambda m: order.get(m, 99))
    for mode in modes:
        mine = sorted((r for r in calls if r["mode"] == mode), key=lambda r: r["seq"])
        seqs = [r["seq"] for r in mine]
        for ax, key in ((top, "evaluated_tokens"), (bottom, "ttft_ms")):
            values = [r[key] for r in mine]
            (line,) = ax.plot(seqs, values, marker="o", ms=3, label=mode)
            after = [(r["seq"], r[key]) for r in mine if r["after_event"] and r[key] is not None]
            if after:
                ax.scatter(*zip(*after, strict=True), s=50, color=line.get_color(), zorder=3)
            side = [(r["seq"], r[key]) for r in mine if r["kind"] != "agent" and r[key] is not None]
            if side:
                ax.scatter(*zip(*side, strict=True), marker="x", s=40, color=line.get_color())
    for seq in sorted({r["seq"] for r in calls if r["event_before"]}):
        for ax in (top, bottom):
            ax.axvline(seq - 0.5, color="grey", linestyle="--", linewidth=1)
    top.set_ylabel("prompt tokens evaluated")
    bottom.set_ylabel("time to first token, ms")
    bottom.set_xlabel("call (in the order sent)")
    top.set_title(f"{event}: each call (large marker: after the event; x: side request)")
    for ax in (top, bottom):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = out_dir / CHART.format(event=event)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(rows: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """One chart per event of ``rows``."""
    events = list(dict.fromkeys(r["event"] for r in rows))
    written = []
    for event in events:
        mine = [r for r in rows if r["event"] == event]
        if any(r["kind"] != "error" for r in mine):
            written.append(write_plot(event, mine, out_dir))
    return written
