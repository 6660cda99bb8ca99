"""Credentials and paths no client should send, at `boundedcode-gateway serve` as an
operator runs it: a header value outside ASCII is a 401 like any wrong credential (never a
500 and a traceback), and a line break in a path never starts a line of its own in the
gateway's log."""

from __future__ import annotations

import base64
import logging
import signal
import socket
from pathlib import Path

import pytest

from boundedcode_gateway.access.keys import key_digest, new_key
from boundedcode_gateway.errors import internal_error
from tests.e2e.test_cli import free_port, start_serve, write_config
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import serve_in_thread

ADMIN_KEY = new_key()
FORGED = "2026-12-01 00:00:00,000 INFO boundedcode_gateway: FORGED admin login"


def raw_request(
    port: int, method: str, path: str, headers: list[tuple[str, bytes]], body: bytes = b""
) -> bytes:
    """One request written byte for byte (no client library to clean its path or headers)."""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
    data = head.encode() + b"".join(k.encode() + b": " + v + b"\r\n" for k, v in headers)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(data + b"\r\n" + body)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_non_ascii_credentials_are_401_and_a_line_break_in_a_path_forges_no_log_line(
    tmp_path: Path,
) -> None:
    fake = FakeLlamaServer()
    with serve_in_thread(fake.app) as upstream:
        admin = {"name": "admin", "sha256": key_digest(ADMIN_KEY), "models": ["*"], "admin": True}
        auth = {"keys": [admin]}
        config = write_config(tmp_path, upstream.url, auth=auth)
        port = free_port()
        proc = start_serve(config, port)
        forging = "/ui/%0a" + FORGED.replace(" ", "%20")
        try:
            answers = {
                # "é" as latin-1, and a UTF-8 one: not base64, whatever its encoding
                "basic latin-1": raw_request(
                    port, "GET", forging, [("Authorization", b"Basic \xe9\xe9\xe9\xe9")]
                ),
                "basic utf-8": raw_request(
                    port, "GET", "/ui/", [("Authorization", "Basic ключ".encode())]
                ),
                "basic of non-utf-8": raw_request(
                    port,
                    "GET",
                    "/ui/",
                    [("Authorization", b"Basic " + base64.b64encode(b"admin:\xff\xfe"))],
                ),
                "bearer": raw_request(
                    port, "GET", "/v1/models", [("Authorization", b"Bearer \xe9" + b"k" * 40)]
                ),
                "chat": raw_request(
                    port,
                    "POST",
                    "/tasks/%0a" + FORGED.replace(" ", "%20") + "/v1/chat/completions",
                    [("Authorization", b"Bearer \xe9"), ("Content-Length", b"0")],
                ),
                "unknown path": raw_request(
                    port,
                    "GET",
                    "/v1/%0a" + FORGED.replace(" ", "%20"),
                    [("Authorization", b"Bearer " + ADMIN_KEY.encode())],
                ),
            }
            key = b"Bearer " + ADMIN_KEY.encode()
            other_headers = {
                name: raw_request(
                    port,
                    "POST",
                    "/v1/messages",
                    [
                        ("Authorization", key),
                        ("anthropic-version", b"2023-06-01"),
                        ("Content-Type", b"application/json"),
                        ("Content-Length", b"2"),
                        (name, b"\xe9\xff"),
                    ],
                    b"{}",
                )
                for name in (
                    "Origin",
                    "x-api-key",
                    "X-BoundedCode-Task",
                    "X-BoundedCode-Purpose",
                    "anthropic-version",
                    "anthropic-beta",
                )
            }
        finally:
            proc.send_signal(signal.SIGTERM)
            output = proc.communicate(timeout=30)[0].decode(errors="replace")
    statuses = {name: status_of(answer) for name, answer in answers.items()}
    assert statuses == {
        "basic latin-1": 401,
        "basic utf-8": 401,
        "basic of non-utf-8": 401,
        "bearer": 401,
        "chat": 401,
        "unknown path": 404,
    }, output
    # any other header outside ASCII is refused (or ignored) in the same words
    others = {name: status_of(answer) for name, answer in other_headers.items()}
    assert all(400 <= status < 500 for status in others.values()), others
    assert b"basic realm=" in answers["basic latin-1"].lower(), answers["basic latin-1"]
    assert "Traceback" not in output and "internal error" not in output, output
    # whatever the gateway wrote of those paths, none of it begins a line
    assert not any(line.startswith(FORGED) for line in output.splitlines()), output


def test_a_fault_on_a_path_with_a_line_break_logs_it_escaped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What the gateway logs of a request it failed on, for a path a caller chose."""
    caplog.set_level(logging.ERROR, logger="boundedcode_gateway.errors")
    try:
        raise RuntimeError("a bug")
    except RuntimeError:
        error = internal_error("GET /ui/\n" + FORGED + "\x1b[2J\u202e")
    (record,) = caplog.records
    logged = record.getMessage()
    assert "\n" not in logged and "\x1b" not in logged and "\u202e" not in logged
    assert logged == "internal error in GET /ui/\\x0a" + FORGED + "\\x1b[2J\\u202e"
    # the caller is told where, in the same words
    assert "\n" not in error.message
