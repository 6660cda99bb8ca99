"""Processes of the benchmark: started pinned to a core, waited for, measured, stopped by PID.

Every process runs in its own session so that stopping it also stops whatever
it started (uvicorn workers, node's helpers), and only those.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def cores() -> tuple[int | None, int | None]:
    """(core for the fake and the load generator, core for the target), or no pinning."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        return None, None
    return available[0], available[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def start(
    name: str,
    argv: Sequence[str],
    core: int | None,
    log_dir: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Proc:
    """Start ``argv`` under ``taskset`` on ``core``, its output into ``log_dir/name.log``."""
    cmd = list(argv)
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd]
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
    return Proc(name, popen, log_path)


def wait_listening(proc: Proc, port: int, timeout_s: float) -> None:
    """Until ``port`` accepts a connection; raises with the log if the process died or hung."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.log_tail()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.1)
    raise RuntimeError(
        f"{proc.name} did not listen on {port} in {timeout_s:.0f} s:\n{proc.log_tail()}"
    )


def stop(proc: Proc, grace_s: float = 5.0) -> None:
    """SIGTERM to the process's own session, SIGKILL after ``grace_s``."""
    if proc.alive():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.popen.wait(grace_s)
    # children that outlived their parent are still in its session
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, utime + stime in ticks) from /proc; None if the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # the command name is in parentheses and may hold spaces: split after its last ")"
    fields = raw[raw.rindex(b")") + 2 :].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of ``root`` and all its live descendants."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                parents[int(entry)], ticks[int(entry)] = st
    total, todo, seen = 0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += ticks.get(pid, 0)
        todo.extend(child for child, parent in parents.items() if parent == pid)
    return total / _TICKS


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "n/a"
