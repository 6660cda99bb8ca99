"""A gateway run under the usual umask (022) writes its data folder for its own user alone:
every folder 0700, every file 0600, an earlier folder open to others tightened; a seal key
others may read stops the start."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from boundedcode_gateway.fronts.sealing import KEY_FILE
from boundedcode_gateway.reasoning_store.folders import folder_name
from tests.e2e.test_cli import free_port
from tests.fakes.common import Reply
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.llama_server_process import write_binary
from tests.fakes.server import serve_in_thread

TASK = "MixedCase"
USUAL_UMASK = 0o022


def write_config(tmp_path: Path, upstream_url: str) -> Path:
    """An external profile (answers with reasoning, so the task's folder is written) and a
    managed one on the fake llama-server (so its log is written)."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    config = tmp_path / "gateway.yaml"
    whole: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "llama_server_bin": str(write_binary(tmp_path)),
        "models": {
            "local": {"provider": "local", "external_url": upstream_url},
            "managed": {"provider": "local", "model_path": str(model)},
        },
    }
    config.write_text(yaml.safe_dump(whole))
    return config


def serve_argv(config: Path, port: int) -> list[str]:
    command = ["serve", "--config", str(config), "--port", str(port)]
    return [sys.executable, "-m", "boundedcode_gateway", *command]


def serve(config: Path, port: int) -> subprocess.Popen[str]:
    """``serve`` under the usual umask, once it answers ``/ready`` (its managed server up)."""
    proc = subprocess.Popen(
        serve_argv(config, port),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        umask=USUAL_UMASK,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(proc.communicate()[0])


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, output
    return output


def modes_under(root: Path) -> dict[str, str]:
    """Each path under ``root`` (``root`` itself as ``.``) and its permission bits."""
    found = {".": root}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            found[str(path.relative_to(root))] = path
    return {name: f"{stat.S_IMODE(p.lstat().st_mode):04o}" for name, p in found.items()}


def test_a_run_writes_every_file_for_its_own_user_alone(tmp_path: Path) -> None:
    fake = FakeLlamaServer()
    fake.queue(
        Reply(
            content="",
            reasoning_content="Read the file first. " * 8,
            tool_calls=[{"name": "read_file", "arguments": '{"path": "parser.py"}'}],
        )
    )
    data = tmp_path / "data"
    with serve_in_thread(fake.app) as upstream:
        port = free_port()
        proc = serve(write_config(tmp_path, upstream.url), port)
        try:
            reply = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                headers={"X-BoundedCode-Task": TASK},
                json={"model": "local", "messages": [{"role": "user", "content": "go"}]},
                timeout=30,
            )
            assert reply.status_code == 200, reply.text
        finally:
            stop(proc)
    modes = modes_under(data)
    # what a run writes: the call log, the ledger, the task's reasoning, the server's log
    for written in [
        "calls.jsonl",
        "ledger.db",
        KEY_FILE,
        f"tasks/{folder_name(TASK)}/local-replay.jsonl",
        "llama-server/managed.log",
    ]:
        assert written in modes, sorted(modes)
    wrong = {
        name: m for name, m in modes.items() if m != ("0700" if (data / name).is_dir() else "0600")
    }
    assert not wrong, wrong


def test_an_earlier_data_folder_open_to_others_is_tightened(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    old_log = data / "calls.jsonl"
    old_log.write_text("")
    data.chmod(0o755)
    old_log.chmod(0o644)
    fake = FakeLlamaServer()
    with serve_in_thread(fake.app) as upstream:
        port = free_port()
        proc = serve(write_config(tmp_path, upstream.url), port)
        try:
            reply = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={"model": "local", "messages": [{"role": "user", "content": "go"}]},
                timeout=30,
            )
            assert reply.status_code == 200, reply.text
        finally:
            output = stop(proc)
    modes = modes_under(data)
    assert modes["."] == "0700" and modes["calls.jsonl"] == "0600", modes
    assert f"the data folder {data} was open to others (mode 0755)" in output
    assert f"{old_log} was open to others (mode 0644); it is now 0600" in output


def test_a_seal_key_others_may_read_stops_the_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    key = data / KEY_FILE
    key.write_bytes(os.urandom(32))
    key.chmod(0o644)
    config = write_config(tmp_path, "http://127.0.0.1:9")
    proc = subprocess.run(
        serve_argv(config, free_port()),
        capture_output=True,
        text=True,
        timeout=30,
        umask=USUAL_UMASK,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"the seal key {key} is open to others (mode 0644)" in proc.stderr
    assert f"chmod 600 {key}" in proc.stderr
    assert "Traceback" not in proc.stderr
    # refused, not changed: whether to keep it is the operator's to decide
    assert stat.S_IMODE(key.stat().st_mode) == 0o644
    assert not (data / "llama-server").exists()  # stopped before any server started
