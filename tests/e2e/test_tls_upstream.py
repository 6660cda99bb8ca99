"""Cloud upstreams speak HTTPS: the gateway verifies their certificates with the system's
trust store (``SSL_CERT_FILE`` adds a private CA), streams included, and names the failure
when a certificate does not verify."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme
import yaml

from tests.e2e.test_cli import free_port, start_serve
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.common import Reply
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.server import RunningServer, serve_in_thread, stop_all

KEY = "sk-tls-test-0123456789"


@pytest.fixture
def tls_upstreams(
    tmp_path: Path,
) -> Iterator[tuple[Path, FakeAnthropic, FakeOpenAI, list[RunningServer]]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    claude, gpt = FakeAnthropic(api_key=KEY), FakeOpenAI(api_key=KEY, models={"gpt-5.1"})
    tls = (str(cert_file), str(key_file))
    servers = [serve_in_thread(f.app, tls=tls) for f in (claude, gpt)]
    try:
        yield ca_file, claude, gpt, servers
    finally:
        stop_all(servers)


def _config(tmp_path: Path, servers: list[RunningServer]) -> Path:
    config = tmp_path / "gateway.yaml"
    models = {
        "claude": {
            "provider": "anthropic",
            "model": "claude-sonnet-4-5",
            "api_key_env": "TLS_TEST_KEY",
            "base_url": servers[0].url + "/v1",
        },
        "gpt": {
            "provider": "openai",
            "model": "gpt-5.1",
            "api_key_env": "TLS_TEST_KEY",
            "base_url": servers[1].url + "/v1",
        },
    }
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "models": models}))
    return config


def _chat(port: int, model: str, stream: bool) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30)


def test_https_upstreams_whole_and_streamed(
    tmp_path: Path, tls_upstreams: tuple[Path, FakeAnthropic, FakeOpenAI, list[RunningServer]]
) -> None:
    ca_file, claude, gpt, servers = tls_upstreams
    claude.queue(Reply(content="over tls"), Reply(content="streamed over tls"))
    gpt.queue(Reply(content="openai over tls"), Reply(content="openai streamed"))
    port = free_port()
    env = {**os.environ, "TLS_TEST_KEY": KEY, "SSL_CERT_FILE": str(ca_file)}
    proc = start_serve(_config(tmp_path, servers), port, env)
    try:
        assert _chat(port, "claude", False).json()["choices"][0]["message"]["content"] == "over tls"
        streamed = _chat(port, "claude", True)
        assert streamed.status_code == 200 and b"streamed over tls" not in streamed.content
        assert b'"content":"streamed"' in streamed.content  # one token per delta
        assert streamed.content.endswith(b"data: [DONE]\n\n")
        assert (
            _chat(port, "gpt", False).json()["choices"][0]["message"]["content"]
            == "openai over tls"
        )
        assert _chat(port, "gpt", True).content.endswith(b"data: [DONE]\n\n")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)


def test_a_certificate_that_does_not_verify_is_a_named_upstream_failure(
    tmp_path: Path, tls_upstreams: tuple[Path, FakeAnthropic, FakeOpenAI, list[RunningServer]]
) -> None:
    _, _, _, servers = tls_upstreams
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    proc = start_serve(_config(tmp_path, servers), port, {**env, "TLS_TEST_KEY": KEY})
    try:
        answer = _chat(port, "claude", False)
        assert answer.status_code in (502, 503)
        assert "certificate" in answer.json()["error"]["message"].lower()
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200  # still serving
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
