"""The overhead benchmark still runs: its smoke mode, direct and this gateway only, ~10 s.

Speed is measured by `make bench-overhead`, never asserted here; this only checks
that every lane produces numbers for both targets and that every answer was right.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"^-?[\d,]+(\.\d+)?$")


def test_smoke_run_prints_numbers_for_direct_and_gateway(tmp_path: Path) -> None:
    samples_file = tmp_path / "samples.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.overhead", "--smoke", "--json", str(samples_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    # the table's header names the two targets, in this order
    assert ["direct", "gateway"] in [line.split() for line in lines], done.stdout[-2000:]
    rows = {line[:40].strip(): line[40:].split() for line in lines if line.startswith("(")}
    # every measure of the gateway is a number; direct has no "added" (it is the baseline)
    assert len(rows) >= 20
    for label, cells in rows.items():
        assert len(cells) == 2, (label, cells)
        assert NUMBER.match(cells[1]), (label, cells)
        if "added" not in label and "CPU" not in label:
            assert NUMBER.match(cells[0]), (label, cells)
    errors = next(line for line in lines if line.startswith("errors")).split()[1:]
    assert errors == ["0", "0"]
    samples = orjson.loads(samples_file.read_bytes())
    lanes = {s["lane"] for s in samples}
    assert {"a-small", "a-agent", "b-c16", "b-c64", "d-c1", "d-c16"} <= lanes
    assert all(s["ok"] > 0 and s["errors"] == 0 for s in samples)
    assert {s["target"] for s in samples} == {"direct", "gateway"}
