"""A request body's pace (``limits.body_grace_s``, ``min_body_rate_kib_s``, ``max_body_s``)
and the cap on connections (``limits.max_connections``), against ``serve`` in a process of
its own: a trickled body is cut with a 408 in its caller's API's shape within seconds, slow
bodies do not hold their connections or the gateway's memory, a healthy large body still
goes through, and a connection past the cap is answered 503 as it opens."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.e2e.test_cli import free_port, start_serve, write_config
from tests.e2e.test_connection_limits import closed_within, connect
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import serve_in_thread

# the limits the review that found the trickle ran with; the body's pace is the default
REVIEWED = {"header_timeout_s": 2.0, "idle_timeout_s": 3.0}
# the longest any trickle here goes on: a body still open by then was never cut
TRICKLE_FOR_S = 15.0


@dataclass
class Serving:
    port: int
    proc: subprocess.Popen[bytes]
    output: list[str]

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")


def _serve(tmp_path: Path, limits: dict[str, Any]) -> Iterator[Serving]:
    fake = FakeLlamaServer()
    with serve_in_thread(fake.app) as upstream:
        config = write_config(tmp_path, upstream.url, limits=limits)
        port = free_port()
        proc = start_serve(config, port)
        output: list[str] = []
        try:
            yield Serving(port, proc, output)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                out, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            output.append(out.decode("utf-8", "replace"))


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Serving]:
    yield from _serve(tmp_path, REVIEWED)


def head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def trickle(sock: socket.socket, every_s: float, piece: bytes, for_s: float) -> float:
    """Send ``piece`` every ``every_s`` until the server closes (or ``for_s`` has passed);
    the seconds the connection stayed open."""
    started = time.monotonic()
    while time.monotonic() - started < for_s:
        try:
            sock.sendall(piece)
        except OSError:
            break
        if closed_within(sock, every_s):
            break
    return time.monotonic() - started


def answer_of(sock: socket.socket) -> tuple[int, bytes]:
    """The status and body of what the server sent before it closed (b'' if nothing)."""
    sock.settimeout(0.5)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    if not data:
        return 0, b""
    head_part, _, body = data.partition(b"\r\n\r\n")
    return int(head_part.split(b" ")[1]), body


def _trickled_answer(port: int, path: str) -> tuple[float, int, bytes]:
    sock = connect(port)
    sock.sendall(head(path, 100))
    started = time.monotonic()
    # a byte a second: the idle timer (3 s) never fires
    data = b""
    sock.settimeout(1.0)
    while time.monotonic() - started < TRICKLE_FOR_S:
        try:
            sock.sendall(b" ")
            got = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not got:
            break
        data += got
    held = time.monotonic() - started
    sock.settimeout(0.5)
    try:
        while got := sock.recv(65536):
            data += got
    except OSError:
        pass
    sock.close()
    if not data:
        return held, 0, b""
    head_part, _, body = data.partition(b"\r\n\r\n")
    return held, int(head_part.split(b" ")[1]), body


def test_a_body_trickled_a_byte_a_second_is_cut_within_seconds(serving: Serving) -> None:
    held, status, body = _trickled_answer(serving.port, "/v1/chat/completions")
    # body_grace_s (5 s), then the average (a byte a second) is far below 64 KiB/s
    assert held < 8.0
    assert status == 408
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "request_timeout"
    assert "limits.min_body_rate_kib_s" in error["message"]
    assert httpx.get(f"http://127.0.0.1:{serving.port}/health", timeout=5).status_code == 200


def test_a_trickled_messages_body_gets_anthropics_408(serving: Serving) -> None:
    held, status, body = _trickled_answer(serving.port, "/v1/messages")
    assert held < 8.0
    assert status == 408
    answer = orjson.loads(body)
    assert answer["type"] == "error"
    assert answer["error"]["type"] == "invalid_request_error"
    assert "min_body_rate_kib_s" in answer["error"]["message"]


def test_a_cut_body_is_told_on_stderr(tmp_path: Path) -> None:
    output: list[str] = []
    for serving in _serve(tmp_path, REVIEWED):
        output = serving.output
        _trickled_answer(serving.port, "/v1/responses")
    lines = [line for line in output[0].splitlines() if "status=408" in line]
    assert lines, output[0][-2000:]
    assert "front=responses" in lines[0]
    assert "code=request_timeout" in lines[0]
    assert "recorded=false" in lines[0]


def test_six_slow_16_mib_bodies_are_closed_and_hold_no_memory(serving: Serving) -> None:
    declared = 16 * 1024 * 1024
    before = serving.rss_kib()
    socks = [connect(serving.port) for _ in range(6)]
    held: list[float] = [0.0] * len(socks)

    def send_slowly(i: int) -> None:
        sock = socks[i]
        sock.sendall(head("/v1/chat/completions", declared))
        # a quarter of a MiB at once, then 4 KiB every 0.25 s (16 KiB/s): below the rate
        sock.sendall(b" " * (256 * 1024))
        held[i] = trickle(sock, 0.25, b" " * 4096, TRICKLE_FOR_S)

    peak = before
    threads = [threading.Thread(target=send_slowly, args=(i,)) for i in range(len(socks))]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, serving.rss_kib())
        time.sleep(0.1)
    for thread in threads:
        thread.join()
    for sock in socks:
        sock.close()
    # each is cut once its grace has run and its average is below 64 KiB/s
    assert max(held) < 9.0, held
    assert (peak - before) / 1024 < 64


@pytest.fixture
def short_deadline(tmp_path: Path) -> Iterator[Serving]:
    yield from _serve(tmp_path, {**REVIEWED, "max_body_s": 6.0})


def test_six_16_mib_bodies_sent_fast_then_trickled_are_bounded(short_deadline: Serving) -> None:
    """The review's case: each sends nearly all of 16 MiB at once, then a byte a second, so
    its average stays high; the deadline ends them, and the reading budget (48 MiB by
    default) refuses those that would pass it, so memory stays under 64 MiB."""
    declared = 16 * 1024 * 1024
    before = short_deadline.rss_kib()
    held: list[float] = [0.0] * 6

    def burst_then_trickle(i: int) -> None:
        sock = connect(short_deadline.port)
        try:
            sock.sendall(head("/v1/chat/completions", declared))
            sock.sendall(b" " * (declared - 1024))
        except OSError:
            pass  # refused while it sent
        held[i] = trickle(sock, 1.0, b" ", TRICKLE_FOR_S)
        sock.close()

    peak = before
    threads = [threading.Thread(target=burst_then_trickle, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, short_deadline.rss_kib())
        time.sleep(0.05)
    for thread in threads:
        thread.join()
    assert max(held) < 9.0, held  # max_body_s (6 s) after the bursts, all of them
    assert (peak - before) / 1024 < 64, (before, peak)
    port = short_deadline.port
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200


def test_a_large_body_at_a_healthy_rate_goes_through(serving: Serving) -> None:
    # 9 MiB in 64 KiB pieces at about 1 MiB/s: past the grace, above the rate throughout
    body = orjson.dumps(
        {
            "model": "local",
            "messages": [{"role": "user", "content": "hello " * (1024 * 1024 + 512 * 1024)}],
        }
    )

    def paced() -> Iterator[bytes]:
        for at in range(0, len(body), 64 * 1024):
            yield body[at : at + 64 * 1024]
            time.sleep(1 / 16)

    started = time.monotonic()
    resp = httpx.post(
        f"http://127.0.0.1:{serving.port}/v1/chat/completions",
        content=paced(),
        headers={"content-type": "application/json", "content-length": str(len(body))},
        timeout=60,
    )
    assert time.monotonic() - started > 5.0  # it did run past the grace
    # read whole and passed on: the upstream itself answers that it is too long
    assert resp.status_code == 400, resp.text[:500]
    assert resp.json()["error"]["code"] == "context_length_exceeded"


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Serving]:
    yield from _serve(tmp_path, {**REVIEWED, "max_connections": 4})


def test_a_connection_past_the_cap_is_answered_503_as_it_opens(capped: Serving) -> None:
    held = [connect(capped.port) for _ in range(4)]
    try:
        time.sleep(0.3)
        extra = connect(capped.port)
        status, body = answer_of(extra)
        extra.close()
        assert status == 503
        assert orjson.loads(body)["error"]["code"] == "too_many_connections"
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    assert httpx.get(f"http://127.0.0.1:{capped.port}/health", timeout=5).status_code == 200
