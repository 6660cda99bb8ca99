"""The printed table: one row per measure, one column per target, then the targets as ratios."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.overhead.results import Results

GATEWAY = "gateway"
PEERS = ("litellm", "portkey")


def fmt(value: float) -> str:
    if math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


Cell = Callable[[Results, str], float]


def _median(lane: str, metric: str) -> Cell:
    return lambda r, t: r.median(lane, t, metric)


def _added(lane: str, metric: str) -> Cell:
    return lambda r, t: float("nan") if t == "direct" else r.added(lane, t, metric)


# (lane, label, cell); the lane decides whether a target has a value at all
ROWS: list[tuple[str, str, Cell]] = [
    ("a-small", "(a) c1 small: p50 ms", _median("a-small", "p50_ms")),
    ("a-small", "(a) c1 small: p99 ms", _median("a-small", "p99_ms")),
    ("a-small", "(a) c1 small: added p50 ms", _added("a-small", "p50_ms")),
    ("a-small", "(a) c1 small: added p99 ms", _added("a-small", "p99_ms")),
    ("a-agent", "(a) c1 50 KB agent: p50 ms", _median("a-agent", "p50_ms")),
    ("a-agent", "(a) c1 50 KB agent: added p50 ms", _added("a-agent", "p50_ms")),
    ("a-agent", "(a) c1 50 KB agent: added p99 ms", _added("a-agent", "p99_ms")),
    ("b-c16", "(b) c16: requests/s", _median("b-c16", "rps")),
    ("b-c16", "(b) c16: p50 ms", _median("b-c16", "p50_ms")),
    ("b-c16", "(b) c16: p99 ms", _median("b-c16", "p99_ms")),
    ("b-c64", "(b) c64: requests/s", _median("b-c64", "rps")),
    ("b-c64", "(b) c64: p50 ms", _median("b-c64", "p50_ms")),
    ("b-c64", "(b) c64: p99 ms", _median("b-c64", "p99_ms")),
    ("a-small", "(c) CPU ms/request, c1", _median("a-small", "cpu_ms_per_req")),
    ("b-c16", "(c) CPU ms/request, c16", _median("b-c16", "cpu_ms_per_req")),
    ("a-agent", "(c) CPU ms/request, 50 KB", _median("a-agent", "cpu_ms_per_req")),
    ("d-c1", "(d) stream c1: added first chunk ms", _added("d-c1", "first_p50_ms")),
    ("d-c1", "(d) stream c1: added last chunk ms", _added("d-c1", "p50_ms")),
    ("d-c1", "(d) stream c1: CPU ms/stream", _median("d-c1", "cpu_ms_per_req")),
    ("d-c16", "(d) stream c16: streams/s", _median("d-c16", "rps")),
    ("d-c16", "(d) stream c16: added first chunk ms", _added("d-c16", "first_p50_ms")),
    ("d-c16", "(d) stream c16: added last chunk ms", _added("d-c16", "p50_ms")),
    ("d-c16", "(d) stream c16: CPU ms/stream", _median("d-c16", "cpu_ms_per_req")),
    ("e-c1", "(e) OpenAI→Anthropic c1: p50 ms", _median("e-c1", "p50_ms")),
    ("e-c1", "(e) OpenAI→Anthropic c1: added p50 ms", _added("e-c1", "p50_ms")),
    ("e-c1", "(e) OpenAI→Anthropic c1: CPU ms/req", _median("e-c1", "cpu_ms_per_req")),
    ("e-stream", "(e) stream c1: added first chunk ms", _added("e-stream", "first_p50_ms")),
    ("e-stream", "(e) stream c1: added last chunk ms", _added("e-stream", "p50_ms")),
]


@dataclass(frozen=True)
class Goal:
    label: str
    lane: str
    measure: Cell
    lower_is_better: bool
    limit: float  # the allowed ratio gateway / best peer
    peers: tuple[str, ...] = PEERS


GOALS: list[Goal] = [
    Goal("added p50 at c1 <= 0.2x best peer", "a-small", _added("a-small", "p50_ms"), True, 0.2),
    Goal("CPU per request <= 0.2x", "b-c16", _median("b-c16", "cpu_ms_per_req"), True, 0.2),
    Goal("requests/s at c16 >= 4x", "b-c16", _median("b-c16", "rps"), False, 4.0),
    Goal(
        "stream added first chunk <= 0.05x",
        "d-c1",
        _added("d-c1", "first_p50_ms"),
        True,
        0.05,
    ),
    Goal("CPU per 200-chunk stream <= 0.5x", "d-c1", _median("d-c1", "cpu_ms_per_req"), True, 0.5),
    Goal(
        "requests/s at c16 >= 50x LiteLLM",
        "b-c16",
        _median("b-c16", "rps"),
        False,
        50.0,
        ("litellm",),
    ),
]


def _note(notes: dict[str, dict[str, str]], lane: str, target: str) -> str:
    return notes.get(target, {}).get(lane, "")


def render(
    results: Results,
    targets: Sequence[str],
    notes: dict[str, dict[str, str]],
    lanes: Sequence[str],
) -> str:
    """The table of measures and the table of goals, as text."""
    label_w = max(len(label) for _, label, _ in ROWS) + 2
    widths = [max(10, len(t) + 2) for t in targets]
    out = ["".ljust(label_w) + "".join(t.rjust(w) for t, w in zip(targets, widths, strict=True))]
    for lane, label, cell in ROWS:
        if lane not in lanes:
            continue
        cells = []
        for t, w in zip(targets, widths, strict=True):
            text = fmt(cell(results, t)) if results.has(lane, t) else "-"
            if text == "-" and _note(notes, lane, t):
                text = "n/a"
            cells.append(text.rjust(w))
        out.append(label.ljust(label_w) + "".join(cells))
    errors = [results.errors(t) for t in targets]
    out.append(
        "errors".ljust(label_w)
        + "".join(str(e[0]).rjust(w) for e, w in zip(errors, widths, strict=True))
    )
    for t in targets:
        for lane in lanes:
            if _note(notes, lane, t):
                out.append(f"  {t}, {lane}: {_note(notes, lane, t)}")
                break
        count, sample = results.errors(t)
        if count:
            out.append(f"  {t}: first error: {sample[:160]}")
    return "\n".join(out)


def render_goals(results: Results, lanes: Sequence[str]) -> str:
    """Each goal as gateway / best peer in the same run, and whether it is met."""
    out = [f"{'goal':40}{'gateway':>10}{'best peer':>12}{'ratio':>9}  result"]
    for g in GOALS:
        if g.lane not in lanes:
            continue
        mine = g.measure(results, GATEWAY) if results.has(g.lane, GATEWAY) else float("nan")
        theirs = [(g.measure(results, p), p) for p in g.peers if results.has(g.lane, p)]
        if not theirs or math.isnan(mine):
            out.append(f"{g.label:40}{fmt(mine):>10}{'-':>12}{'-':>9}  no peer measured")
            continue
        best, peer = min(theirs) if g.lower_is_better else max(theirs)
        ratio = mine / best if best else float("nan")
        met = ratio <= g.limit if g.lower_is_better else ratio >= g.limit
        verdict = "met" if met else "MISSED"
        out.append(
            f"{g.label:40}{fmt(mine):>10}{fmt(best) + ' ' + peer[:2]:>12}{ratio:>8.3f}x  {verdict}"
        )
    return "\n".join(out)
