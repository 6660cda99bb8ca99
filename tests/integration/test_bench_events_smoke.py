"""The events benchmark's smoke, on the real pinned llama-server: the ``restart`` event cut to
two turns, in the two gateway modes, as ``make bench-inference BENCH_ARGS="--events
all"`` runs every event in full.

With slot files the turn after the server was killed and started again finds the
task's conversation restored and evaluates only its new input; without them it
evaluates the whole conversation again.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from bench.inference.__main__ import main as bench_main

pytestmark = pytest.mark.llama_server


@pytest.mark.timeout(300)
def test_bench_events_smoke(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["--events", "restart", "--event-modes", "slot-files,no-slot-files", "--turns", "2"]
    # short answers: the smoke checks the machinery, the full run the answers' lengths
    argv += ["--max-tokens", "24", "--reasoning-budget", "12", "--out", str(out)]
    assert bench_main(argv) == 0
    samples = [orjson.loads(line) for line in (out / "samples.jsonl").read_bytes().splitlines()]
    after = {}
    for mode in ("slot-files", "no-slot-files"):
        rows = [s for s in samples if s["mode"] == mode]
        assert [(r["turn"], r["event_before"], r["after_event"]) for r in rows] == [
            (1, False, False),
            (2, True, True),
        ]
        assert rows[0]["miss_cause"] == "first_call" and rows[0]["evaluated_tokens"] > 1500
        assert all(r["ttft_ms"] is not None and r["ttft_ms"] > 0 for r in rows)
        after[mode] = rows[1]
    restored, lost = after["slot-files"], after["no-slot-files"]
    assert restored["restored_tokens"] > 1500 and restored["restore_failure"] is None, restored
    assert restored["evaluated_tokens"] * 4 < lost["evaluated_tokens"], (restored, lost)
    assert lost["restored_tokens"] is None
    report = (out / "report.md").read_text()
    assert "| slot-files / no-slot-files |" in report
    png = out / "events-restart.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
