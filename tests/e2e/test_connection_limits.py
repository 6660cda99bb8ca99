"""The limits of a caller's connection (``limits:``): a head that never ends, idle connections,
an oversized head, a stalled body and bytes that are not HTTP are closed or refused, and the
gateway keeps answering ``/health`` meanwhile."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import yaml

from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.e2e.test_cli import free_port, start_serve
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import serve_in_thread

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes the connection within ``seconds`` (what it sent is read)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of the one response the server sends before it closes."""
    sock.settimeout(10)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), {k.lower(): v for k, v in headers.items()}, body


def assert_openai_error(headers: dict[str, str], body: bytes, code: str) -> None:
    assert headers["content-type"] == "application/json"
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code


@pytest.fixture
def serve_port(tmp_path: Path) -> Iterator[int]:
    """``boundedcode-gateway serve`` in a process of its own, with short limits."""
    fake = FakeLlamaServer()
    with serve_in_thread(fake.app) as upstream:
        config = tmp_path / "gateway.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "data_dir": str(tmp_path / "data"),
                    "limits": {"header_timeout_s": 1.0, "idle_timeout_s": 1.0},
                    "models": {"local": {"provider": "local", "external_url": upstream.url}},
                }
            )
        )
        port = free_port()
        proc = start_serve(config, port)
        try:
            yield port
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def test_a_slow_head_is_closed_after_the_header_timeout(serve_port: int) -> None:
    sock = connect(serve_port)
    started = time.monotonic()
    sock.sendall(HEAD)
    # one byte of a header every 0.2 s: never idle, never done
    for byte in b"X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa":
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
        if closed_within(sock, 0.2):
            break
    elapsed = time.monotonic() - started
    assert closed_within(sock, 0.1)
    assert 0.9 <= elapsed < 4.0
    sock.close()
    assert httpx.get(f"http://127.0.0.1:{serve_port}/health", timeout=5).status_code == 200


def test_a_connection_that_sends_nothing_is_closed(serve_port: int) -> None:
    sock = connect(serve_port)
    assert not closed_within(sock, 0.5)
    assert closed_within(sock, 3.0)
    sock.close()


def test_a_kept_alive_connection_is_closed_when_idle(serve_port: int) -> None:
    sock = connect(serve_port)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    sock.settimeout(5)
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    assert closed_within(sock, 3.0)
    sock.close()


def test_a_stalled_body_is_closed(serve_port: int) -> None:
    sock = connect(serve_port)
    sock.sendall(HEAD + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    assert closed_within(sock, 4.0)
    sock.close()


@pytest.fixture
def limited(upstreams: Upstreams, start_gateway: GatewayFactory) -> Gateway:
    return start_gateway(
        upstreams.profiles, limits={"header_timeout_s": 1.5, "max_header_bytes": 4096}
    )


def test_three_hundred_idle_connections_do_not_stop_health(limited: Gateway) -> None:
    port = limited.server.port
    idle = [connect(port) for _ in range(300)]
    # half of them with a head begun and never finished
    for sock in idle[::2]:
        sock.sendall(HEAD)
    try:
        started = time.monotonic()
        health = httpx.get(limited.url + "/health", timeout=5)
        assert health.json() == {"status": "ok"}
        assert time.monotonic() - started < 1.0
        reply = limited.client().chat.completions.create(
            model="local", messages=[{"role": "user", "content": "hello"}]
        )
        assert reply.choices[0].message.content
        # every one of them is closed once the header timeout has passed
        deadline = time.monotonic() + 10
        for sock in idle:
            assert closed_within(sock, max(0.1, deadline - time.monotonic()))
    finally:
        for sock in idle:
            sock.close()
    assert len(limited.server._server.server_state.connections) <= 1


def test_a_head_over_the_limit_is_a_431(limited: Gateway) -> None:
    sock = connect(limited.server.port)
    sock.sendall(HEAD + b"X-Big: " + b"a" * 5000 + b"\r\nContent-Length: 2\r\n\r\n{}")
    status, headers, body = read_response(sock)
    sock.close()
    assert status == 431
    assert_openai_error(headers, body, "request_header_fields_too_large")
    assert limited.calls() == []


def test_an_endless_head_is_refused_before_it_ends(limited: Gateway) -> None:
    sock = connect(limited.server.port)
    sock.sendall(HEAD + b"X-Endless: ")
    refused = False
    try:
        for _ in range(100):
            sock.sendall(b"a" * 1024)
    except (BrokenPipeError, ConnectionResetError):
        refused = True
    if not refused:
        status, headers, body = read_response(sock)
        assert status == 431
        assert_openai_error(headers, body, "request_header_fields_too_large")
    sock.close()
    assert httpx.get(limited.url + "/health", timeout=5).status_code == 200


def test_bytes_that_are_not_http_get_an_openai_shaped_400(limited: Gateway) -> None:
    sock = connect(limited.server.port)
    sock.sendall(b"\x16\x03\x01\x02\x00 hello\r\n\r\n")
    status, headers, body = read_response(sock)
    sock.close()
    assert status == 400
    assert_openai_error(headers, body, "invalid_http_request")
