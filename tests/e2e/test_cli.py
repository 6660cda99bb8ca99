"""The command line: serve shuts down cleanly on SIGTERM/SIGINT with in-flight calls recorded,
and `calls` prints them."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from boundedcode_gateway.metering.calllog import read_calls
from tests.fakes.common import Reply
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.llama_server_process import write_binary
from tests.fakes.server import serve_in_thread


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(tmp_path: Path, upstream_url: str, **settings: Any) -> Path:
    """A configuration with one profile, ``local``, on the given server, and any other
    top-level ``settings`` (``auth``, ``limits``, ...)."""
    config = tmp_path / "gateway.yaml"
    whole: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "models": {"local": {"provider": "local", "external_url": upstream_url}},
        **settings,
    }
    config.write_text(yaml.safe_dump(whole))
    return config


def start_serve(
    config: Path, port: int, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "boundedcode_gateway",
            "serve",
            "--config",
            str(config),
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError(proc.communicate()[0].decode())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_lets_in_flight_calls_finish_and_be_recorded(
    tmp_path: Path, sig: signal.Signals
) -> None:
    fake = FakeLlamaServer()
    fake.queue(
        Reply(content="slow answer", delay_ms=1200),
        Reply(content="a slow stream of words " * 3, chunk_delay_ms=60),
    )
    with serve_in_thread(fake.app) as upstream:
        config = write_config(tmp_path, upstream.url)
        port = free_port()
        proc = start_serve(config, port)
        results: dict[str, Any] = {}

        def call(name: str, stream: bool) -> None:
            resp = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                timeout=20,
                json={
                    "model": "local",
                    "stream": stream,
                    "messages": [{"role": "user", "content": name}],
                },
            )
            results[name] = (resp.status_code, resp.text)

        threads = [
            threading.Thread(target=call, args=("plain", False)),
            threading.Thread(target=call, args=("streamed", True)),
        ]
        for t in threads:
            t.start()
        # both calls in flight at the upstream (on a busy machine the threads take a while)
        deadline = time.monotonic() + 15
        while len(fake.requests.bodies("/v1/chat/completions")) < 2:
            assert time.monotonic() < deadline, "the two calls did not reach the upstream"
            time.sleep(0.02)
        proc.send_signal(sig)
        for t in threads:
            t.join(20)
        output = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 0, output
    assert results["plain"][0] == 200 and '"finish_reason":"stop"' in results["plain"][1]
    assert results["streamed"][0] == 200 and results["streamed"][1].endswith("data: [DONE]\n\n")
    calls = read_calls(tmp_path / "data" / "calls.jsonl")
    answered = [c for c in calls if c["purpose"] == "agent_turn"]
    assert sorted(c["stream"] for c in answered) == [False, True]
    assert all(c["status"] == "ok" for c in answered)
    # a cache repair cut short by the stop is recorded as given up, never lost
    repairs = [c for c in calls if c["purpose"] == "cache_repair"]
    assert len(calls) == len(answered) + len(repairs)
    assert all(c["status"] in ("ok", "abandoned") for c in repairs)


def test_an_open_page_of_calls_does_not_hold_the_stop(tmp_path: Path) -> None:
    """The page's event stream never ends by itself; a stop ends it instead of waiting
    out the calls' grace period (30 s) for it."""
    fake = FakeLlamaServer()
    with serve_in_thread(fake.app) as upstream:
        port = free_port()
        proc = start_serve(write_config(tmp_path, upstream.url), port)
        with httpx.stream("GET", f"http://127.0.0.1:{port}/ui/api/events", timeout=10) as events:
            lines = events.iter_lines()
            assert next(lines) == "event: in_flight"
            proc.send_signal(signal.SIGTERM)
            started = time.monotonic()
            rest = list(lines)  # until the gateway ends the stream
        output = proc.communicate(timeout=30)[0].decode()
    assert time.monotonic() - started < 10, output
    assert proc.returncode == 0, output
    assert rest == ['data: {"calls":[]}', ""]


def test_calls_command_prints_the_table(tmp_path: Path) -> None:
    fake = FakeLlamaServer()
    with serve_in_thread(fake.app) as upstream:
        config = write_config(tmp_path, upstream.url)
        port = free_port()
        proc = start_serve(config, port)
        try:
            for task in ("alpha", "beta", "alpha"):
                httpx.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    timeout=10,
                    headers={"X-BoundedCode-Task": task},
                    json={"model": "local", "messages": [{"role": "user", "content": "x"}]},
                )
            refused = httpx.post(
                f"http://127.0.0.1:{port}/v1/messages",
                timeout=10,
                headers={"X-BoundedCode-Task": "alpha", "anthropic-version": "2023-06-01"},
                json={
                    "model": "local",
                    "max_tokens": 8,
                    "stream": True,
                    "messages": [{"role": "robot", "content": "x"}],
                },
            )
            assert refused.status_code == 400
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "boundedcode_gateway",
            "calls",
            "--config",
            str(config),
            "--task",
            "alpha",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = out.strip().splitlines()
    header = ["started", "task", "purpose", "front", "model", "status", "http", "error"]
    assert lines[0].split()[:8] == header
    turns = [line.split() for line in lines if " agent_turn " in line]
    (refusal,) = [c for c in read_calls(tmp_path / "data" / "calls.jsonl") if c["front"] != "chat"]
    assert refusal["error_code"]
    assert [t[3:8] for t in turns] == [
        ["chat", "local", "ok", "200", "-"],
        ["chat", "local", "ok", "200", "-"],
        # a refusal says which API refused it and why, not a bare "error 400"
        ["messages", "local", "error", "400", refusal["error_code"]],
    ]
    # the rest are the cache repairs that followed alpha's answers
    assert all(" cache_repair " in line for line in lines[1:] if " agent_turn " not in line)
    assert all(" alpha " in line for line in lines[1:])
    assert "beta" not in out


def test_bad_config_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("models:\n  local:\n    provider: local\n    external_url: 8080\n")
    proc = subprocess.run(
        [sys.executable, "-m", "boundedcode_gateway", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "models.local.external_url" in proc.stderr and ":4:" in proc.stderr


def test_a_taken_port_stops_serve_before_any_managed_server_starts(tmp_path: Path) -> None:
    """The gateway holds its port before it starts its llama-servers, so none of them can
    be handed that port: a port already taken ends the start before any server runs."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    data_dir = tmp_path / "data"
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data_dir": str(data_dir),
                "llama_server_bin": str(write_binary(tmp_path)),
                "models": {"local": {"provider": "local", "model_path": str(model)}},
            }
        )
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        serve = ["serve", "--config", str(config), "--port", str(port)]
        proc = subprocess.run(
            [sys.executable, "-m", "boundedcode_gateway", *serve],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "llama-server for local" not in proc.stderr
    assert not (data_dir / "llama-server").exists()
