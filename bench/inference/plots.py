"""The benchmark's charts, one set per workload with the modes overlaid (matplotlib, Agg).

- ``<workload>-evaluated.png``: prompt tokens each call evaluated while its caller
  waited, per step, one line per mode, each miss marked with its cause;
- ``<workload>-cumulative.png``: cumulative evaluated tokens (the repair's included);
- ``<workload>-wait.png``: how long each call took, per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

MISS_LABELS = {"token_split", "history_rewrite", "reasoning_dropped", "template_render", "server"}


def _series(samples: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        out.setdefault(s["mode"], []).append(s)
    return out


def write_plots(workload: str, samples: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """The charts of results.CHARTS for one workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = _series(samples)
    written = []

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for mode, rows in modes.items():
        steps = [r["step"] for r in rows]
        ax.plot(steps, [r["evaluated_tokens"] for r in rows], marker="o", ms=3, label=mode)
        for r in rows:
            if r.get("miss_cause") in MISS_LABELS:
                ax.annotate(
                    r["miss_cause"],
                    (r["step"], r["evaluated_tokens"]),
                    textcoords="offset points",
                    xytext=(3, 6),
                    fontsize=7,
                    rotation=30,
                )
    ylabel = "prompt tokens evaluated while the caller waited"
    title = f"{workload}: evaluated per call"
    written.append(_save(fig, ax, ylabel, title, out_dir / f"{workload}-evaluated.png"))

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for mode, rows in modes.items():
        per_call = [r["evaluated_tokens"] + r["repair_evaluated"] for r in rows]
        ax.plot([r["step"] for r in rows], list(accumulate(per_call)), label=mode)
    ylabel = "cumulative prompt tokens evaluated (repair included)"
    title = f"{workload}: cumulative evaluated"
    written.append(_save(fig, ax, ylabel, title, out_dir / f"{workload}-cumulative.png"))

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for mode, rows in modes.items():
        ax.plot([r["step"] for r in rows], [r["wait_ms"] for r in rows], marker=".", label=mode)
    title = f"{workload}: wait per call"
    ylabel = "time the call took, ms"
    written.append(_save(fig, ax, ylabel, title, out_dir / f"{workload}-wait.png"))
    return written


def _save(fig: Any, ax: Any, ylabel: str, title: str, path: Path) -> Path:
    """Label the chart, write it to ``path`` and free it."""
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
