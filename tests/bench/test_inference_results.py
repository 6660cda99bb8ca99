"""The inference benchmark's report: modes side by side per step, totals against the ideal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.inference import plots, results


def sample(mode: str, step: int, evaluated: int, repair: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "workload": "tool-loop",
        "mode": mode,
        "step": step,
        "purpose": "agent_turn",
        "turn": step,
        "restarted": step == 3,
        "prompt_tokens": 1000 * step,
        "evaluated_tokens": evaluated,
        "repair_evaluated": repair,
        "wait_ms": 500.0,
        "tool_calls": 1 if step == 2 else 0,
        **extra,
    }


SAMPLES = [
    sample("gateway-auto", 1, 1000, 6, miss_cause="first_call"),
    sample("gateway-auto", 2, 100, 6, miss_cause="none"),
    sample("gateway-auto", 3, 120, 0, miss_cause="none"),
    sample("gateway-drop", 1, 1000, 40, miss_cause="first_call"),
    sample("gateway-drop", 2, 100, 40, miss_cause="none"),
    sample("gateway-drop", 3, 160, 0, miss_cause="reasoning_dropped"),
    sample("direct-keep", 1, 1000),
    sample("direct-keep", 2, 104),
    sample("direct-keep", 3, 124),
]


def test_totals_add_the_repair_to_what_was_waited_for() -> None:
    t = results.totals([s for s in SAMPLES if s["mode"] == "gateway-drop"])
    assert (t.calls, t.prompt, t.waited, t.repair, t.evaluated) == (3, 6000, 1260, 80, 1340)
    assert t.misses == {"first_call": 1, "reasoning_dropped": 1}
    assert t.tool_call_turns == 1


def test_report_sets_the_modes_side_by_side_against_the_ideal() -> None:
    text = results.report(SAMPLES, "# run", charts=True)
    lines = text.splitlines()
    assert "| step | purpose | turn | gateway-auto | gateway-drop | direct-keep |" in lines
    assert "| 1 | agent_turn | 1 | 1000 +6 first_call | 1000 +40 first_call | 1000 |" in lines
    assert "| 3 (restart) | agent_turn | 3 | 120 | 160 reasoning_dropped | 124 |" in lines
    auto = next(line for line in lines if line.startswith("| gateway-auto | 3 |"))
    assert "| 1232 | 1.00 x |" in auto  # 1220 waited + 12 repaired, against 1228
    drop = next(line for line in lines if line.startswith("| gateway-drop | 3 |"))
    assert "| 1340 | 1.09 x |" in drop
    assert "![tool-loop: evaluated](tool-loop-evaluated.png)" in lines


def test_plots_are_written_as_pngs(tmp_path: Path) -> None:
    written = plots.write_plots("tool-loop", SAMPLES, tmp_path)
    assert [p.name for p in written] == [f"tool-loop-{c}.png" for c in results.CHARTS]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
