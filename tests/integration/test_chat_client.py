"""The terminal chat client on a real pty: the live progress line, then the answer."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import orjson

from tests.e2e.conftest import Gateway


def run_on_pty(argv: list[str], timeout_s: float) -> str:
    """Run a command with its output on a pseudo-terminal; return everything it wrote."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    out = bytearray()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    data = os.read(leader, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not data:
                    break
                out += data
            elif proc.poll() is not None:
                break
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert proc.returncode == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


def test_progress_line_then_answer(real: Gateway, tmp_path: Path) -> None:
    paragraph = "The gateway keeps the prompt cache warm for coding agents. " * 25
    history = []
    for i in range(10):
        history.append({"role": "user", "content": f"Part {i}: {paragraph}"})
        history.append({"role": "assistant", "content": f"Noted part {i}."})
    path = tmp_path / "history.json"
    path.write_bytes(orjson.dumps(history))
    screen = run_on_pty(
        [
            sys.executable,
            "-m",
            "boundedcode_gateway",
            "chat",
            "--url",
            real.url,
            "--model",
            "smol",
            "--history",
            str(path),
            "--message",
            "Summarise it in one line.",
        ],
        timeout_s=120,
    )
    lines = re.findall(r"reading the conversation: ([\d.]+k?) of ([\d.]+k?) new tokens", screen)
    assert lines, screen
    assert lines[0][1].endswith("k")  # a few thousand new tokens
    assert lines[-1][0] == lines[-1][1]  # the last line: all of them read
    # the answer replaces the progress line: it follows a clear-line after the last one
    answer = screen.rsplit("new tokens", 1)[1]
    assert answer.startswith("\r\x1b[K")
    assert answer.strip("\r\n\x1b[K ")
    call = real.calls()[-1]
    assert call["prompt_tokens"] > 2000 and call["messages"] == 21
