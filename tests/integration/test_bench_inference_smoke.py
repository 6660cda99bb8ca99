"""The inference benchmark's smoke, on the real pinned llama-server: one short workload in
the two gateway modes, as ``make bench-inference`` runs it in full.

With the reasoning restored (``auto``) the server reads each earlier answer once; with
it dropped, every earlier answer is read again without its reasoning — by the cache
repair between the calls, or by the next call — so ``auto`` evaluates fewer tokens.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from bench.inference.__main__ import main as bench_main

pytestmark = pytest.mark.llama_server

TURNS = 6


def test_bench_inference_smoke(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["--workloads", "tool-loop", "--modes", "gateway-auto,gateway-drop"]
    assert bench_main([*argv, "--turns", str(TURNS), "--out", str(out)]) == 0
    samples = [orjson.loads(line) for line in (out / "samples.jsonl").read_bytes().splitlines()]
    by_mode = {m: [s for s in samples if s["mode"] == m] for m in ("gateway-auto", "gateway-drop")}
    assert all(len(rows) == TURNS for rows in by_mode.values())
    # every call after the first has a cause, and the first is named as such
    for rows in by_mode.values():
        assert rows[0]["miss_cause"] == "first_call"
        assert all(r["miss_cause"] not in (None, "first_call") for r in rows[1:])
    evaluated = {
        m: sum(r["evaluated_tokens"] + r["repair_evaluated"] for r in rows)
        for m, rows in by_mode.items()
    }
    assert evaluated["gateway-auto"] < evaluated["gateway-drop"], evaluated
    assert any(r["miss_cause"] == "reasoning_dropped" for r in by_mode["gateway-drop"][1:]) or any(
        r.get("repair_miss_cause") == "reasoning_dropped" for r in by_mode["gateway-drop"]
    )
    report = (out / "report.md").read_text()
    assert "| gateway-auto |" in report and "| gateway-drop |" in report
    for chart in ("evaluated", "cumulative", "wait"):
        png = out / f"tool-loop-{chart}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
