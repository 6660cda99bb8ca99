"""What ``serve`` tells a caller and its own log about itself, against a gateway in a
process of its own: no answer names the server software in its headers (a whole answer,
an error, a stream, a refusal of the connection layer), and a caller that leaves in the
middle of its body is one quiet line, never a traceback."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_cli import free_port, start_serve, write_config
from tests.e2e.test_connection_limits import connect
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import serve_in_thread

# what would name the software behind the gateway in a header's name or value
SOFTWARE = ("uvicorn", "httptools", "uvloop", "python", "asyncio", "starlette", "llama")
HELLO = [{"role": "user", "content": "hello"}]


@dataclass
class Serving:
    port: int
    proc: subprocess.Popen[bytes]
    output: list[str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> str:
        """Stop the gateway; everything it wrote on stdout and stderr."""
        if not self.output:
            self.proc.send_signal(signal.SIGTERM)
            try:
                out, _ = self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, _ = self.proc.communicate()
            self.output.append(out.decode("utf-8", "replace"))
        return self.output[0]


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Serving]:
    fake = FakeLlamaServer()
    with serve_in_thread(fake.app) as upstream:
        config = write_config(tmp_path, upstream.url)
        port = free_port()
        served = Serving(port, start_serve(config, port), [])
        try:
            yield served
        finally:
            served.stop()


def assert_anonymous(where: str, headers: httpx.Headers | dict[str, str]) -> None:
    assert "server" not in {k.lower() for k in headers}, f"{where}: {dict(headers)}"
    assert "x-powered-by" not in {k.lower() for k in headers}, where
    for name, value in headers.items():
        for word in SOFTWARE:
            assert word not in f"{name}: {value}".lower(), f"{where} names {word}: {name}"


def raw_answer(port: int, request: bytes) -> bytes:
    """The answer to ``request`` sent as is, read until the server closes."""
    sock = connect(port)
    sock.sendall(request)
    data = b""
    sock.settimeout(5)
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    sock.close()
    return data


def raw_headers(port: int, request: bytes) -> dict[str, str]:
    """The headers of the answer to ``request`` sent as is."""
    data = raw_answer(port, request)
    head = data.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    assert head[0].startswith("HTTP/1.1 "), data[:200]
    return dict(line.split(": ", 1) for line in head[1:])


def test_no_answer_names_the_server_software(serving: Serving) -> None:
    with httpx.Client(base_url=serving.url, timeout=30) as http:
        health = http.get("/health")
        assert health.status_code == 200
        assert_anonymous("/health", health.headers)
        whole = http.post("/v1/chat/completions", json={"model": "local", "messages": HELLO})
        assert whole.status_code == 200
        assert_anonymous("a whole answer", whole.headers)
        unknown = http.get("/v1/nothing-here")
        assert unknown.status_code == 404
        assert_anonymous("a 404", unknown.headers)
        refused = http.post(
            "/v1/chat/completions", content=b"{", headers={"Content-Type": "application/json"}
        )
        assert refused.status_code == 400
        assert_anonymous("a 400", refused.headers)
        body = {"model": "local", "messages": HELLO, "stream": True}
        with http.stream("POST", "/v1/chat/completions", json=body) as streamed:
            assert streamed.status_code == 200
            assert b"[DONE]" in streamed.read()
            assert_anonymous("a stream", streamed.headers)
        messages = {"model": "local", "max_tokens": 10, "messages": HELLO, "stream": True}
        with http.stream(
            "POST", "/v1/messages", json=messages, headers={"anthropic-version": "2023-06-01"}
        ) as streamed:
            assert streamed.status_code == 200
            streamed.read()
            assert_anonymous("a Messages stream", streamed.headers)
    # the connection layer's own answers: bytes that are not HTTP, a head too large
    assert_anonymous("not HTTP", raw_headers(serving.port, b"NOT HTTP AT ALL\r\n\r\n"))
    huge = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
    assert_anonymous("a head too large", raw_headers(serving.port, huge))
    assert "Traceback" not in serving.stop()


def _leave_mid_body(port: int, declared: int, sent: bytes) -> None:
    sock = connect(port)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: " + str(declared).encode() + b"\r\n\r\n" + sent
    )
    time.sleep(0.2)  # the gateway is reading the body when the caller goes
    sock.close()


def test_a_caller_that_leaves_mid_upload_is_one_quiet_line(serving: Serving) -> None:
    for _ in range(3):
        _leave_mid_body(serving.port, 10_000, b'{"model": "local", "messages": [')
    # the gateway serves on, and a whole call after them is answered
    answer = httpx.post(
        serving.url + "/v1/chat/completions", json={"model": "local", "messages": HELLO}, timeout=30
    )
    assert answer.status_code == 200
    output = serving.stop()
    assert "Traceback" not in output
    assert "Exception in ASGI application" not in output
    assert "CancelledError" not in output
    left = [line for line in output.splitlines() if "client_disconnected" in line]
    assert len(left) == 3, output
    # one line each, of the body it was reading and how far it got
    assert all("recorded=false" in line and "INFO" in line for line in left), left
    assert all("32 of 10000 bytes" in line for line in left), left


@pytest.mark.parametrize("upgrade", [b"websocket", b"h2c"])
def test_an_upgrade_request_is_served_as_plain_http(serving: Serving, upgrade: bytes) -> None:
    """The gateway speaks no WebSocket and no HTTP/2: a request asking to switch is answered
    as the HTTP/1.1 request it is, in JSON, and logs nothing."""
    request = (
        b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
        b"Upgrade: " + upgrade + b"\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\nHTTP2-Settings: AAMAAABkAARAAAAA\r\n\r\n"
    )
    data = raw_answer(serving.port, request)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), data[:300]
    assert b"application/json" in head.lower()
    assert b'"object":"list"' in body
    output = serving.stop()
    assert "Traceback" not in output and "ERROR" not in output, output
    assert "upgrade" not in output.lower(), output
