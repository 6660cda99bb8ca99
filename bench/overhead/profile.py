"""Where the gateway's time goes under one lane: py-spy samples, summed by file and by function.

``python -m bench.overhead --profile b-c16`` loads the gateway as that lane does
while py-spy (from the bench extra) samples it, then prints the self time per
source file and per function. py-spy runs on the load generator's core, so the
sampling does not take the gateway's.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

_FILE = re.compile(r"\(([^:)]+)")
SAMPLE_RATE = 250  # per second; enough for a stable split, light on the sampled process


def py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def start(pid: int, seconds: float, out: Path, core: int | None) -> subprocess.Popen[bytes]:
    binary = py_spy()
    if binary is None:
        raise FileNotFoundError("py-spy is not installed (make bench-overhead installs it)")
    argv = [binary, "record", "-p", str(pid), "-d", str(max(1, round(seconds)))]
    argv += ["-r", str(SAMPLE_RATE), "-f", "raw", "-o", str(out), "--nonblocking"]
    if core is not None:
        argv = ["taskset", "-c", str(core), *argv]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _short(frame: str) -> str:
    return frame.split("site-packages/")[-1] if "site-packages/" in frame else frame


def summary(raw: Path, top: int = 15) -> str:
    """Self time by file and by function, in percent of all samples (idle loop included)."""
    by_file: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        leaf = stack.split(";")[-1]
        match = _FILE.search(leaf)
        by_file[_short(match.group(1)) if match else leaf] += n
        by_function[_short(leaf)] += n
    if not total:
        return "profile: no samples"
    out = [f"profile: {total} samples; self time by file"]
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in by_file.most_common(top)]
    out.append("self time by function")
    out += [f"  {100 * n / total:5.1f}%  {name[:110]}" for name, n in by_function.most_common(top)]
    return "\n".join(out)
