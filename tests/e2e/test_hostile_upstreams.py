"""Upstreams that answer what no well-behaved server would: compressed bombs, answers,
events and heads past the limits, heads trickled in, statuses that are no answer, events
split over several data lines; and calls that run too long, or whose caller stops reading.

Every case is sent through the gateway to a raw-socket upstream (tests/fakes/hostile.py);
the caller gets an OpenAI-shaped error naming the limit, the call is recorded, and the
gateway keeps serving.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.e2e.conftest import Gateway, GatewayFactory
from tests.fakes.common import parse_sse
from tests.fakes.hostile import (
    HostileUpstream,
    Play,
    chunk,
    completion,
    gzip_bomb,
    head,
    json_play,
    openai_stream,
    stream_head,
    whole,
)
from tests.outcomes import outcomes

KEY_ENV = "HOSTILE_UPSTREAM_KEY"
HELLO: list[Any] = [{"role": "user", "content": "hello"}]


@pytest.fixture
def hostile(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostileUpstream]:
    monkeypatch.setenv(KEY_ENV, "sk-hostile-test-key")
    upstream = HostileUpstream().start()
    yield upstream
    upstream.stop()


def start(
    start_gateway: GatewayFactory, upstream: HostileUpstream, attempts: int = 4, **inference: Any
) -> Gateway:
    profile = {
        "provider": "openai",
        "model": "gpt-5.1",
        "api_key_env": KEY_ENV,
        "base_url": upstream.url + "/v1",
        "retry": {"max_attempts": attempts, "max_total_s": 5},
    }
    return start_gateway({"hostile": profile}, inference={"read_timeout_s": 5, **inference})


def chat(gw: Gateway, stream: bool = False, timeout: float = 30) -> httpx.Response:
    body = {"model": "hostile", "messages": HELLO, "stream": stream}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=timeout)


def error_of(resp: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def last_record(gw: Gateway) -> dict[str, Any]:
    calls = gw.calls()
    assert len(calls) == 1
    return calls[0]


def assert_still_serving(gw: Gateway) -> None:
    assert httpx.get(gw.url + "/health", timeout=5).json() == {"status": "ok"}


def limits(**values: float) -> dict[str, Any]:
    return {"upstream_limits": values}


# -- sizes


def test_a_compressed_bomb_stops_at_the_inflated_limit(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    bomb = gzip_bomb(256, prefix=b'{"id": "')  # 256 MiB of zeros in ~256 KiB
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    hostile.queue(Play([whole(200, bomb, headers)]))
    gw = start(start_gateway, hostile, **limits(max_inflated_mib=4))
    started = time.monotonic()
    resp = chat(gw)
    assert time.monotonic() - started < 5
    assert resp.status_code == 502
    error = error_of(resp)
    assert error["code"] == "upstream_response_too_large"
    assert "inference.upstream_limits.max_inflated_mib (4 MiB)" in error["message"]
    record = last_record(gw)
    assert (record["http_status"], record["error_code"]) == (502, "upstream_response_too_large")
    # a bomb is not sent again: the same upstream would only send it again
    assert record["attempts"] == 1 and len(hostile.requests) == 1
    assert_still_serving(gw)


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_answer_past_the_body_limit(
    start_gateway: GatewayFactory, hostile: HostileUpstream, declared: bool
) -> None:
    body = orjson.dumps(completion("x" * (2 << 20)))
    if declared:
        hostile.queue(Play([whole(200, body, {"Content-Type": "application/json"})]))
    else:  # no length: the body ends with the connection
        hostile.queue(Play([head(200, {"Content-Type": "application/json"}), body]))
    gw = start(start_gateway, hostile, **limits(max_body_mib=1))
    resp = chat(gw)
    assert resp.status_code == 502
    error = error_of(resp)
    assert error["code"] == "upstream_response_too_large"
    assert "inference.upstream_limits.max_body_mib (1 MiB)" in error["message"]
    assert last_record(gw)["error_code"] == "upstream_response_too_large"


def test_an_error_body_past_the_limit_is_not_sent_again(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    huge = orjson.dumps({"error": {"message": "m" * (2 << 20), "type": "server_error"}})
    hostile.queue(Play([whole(503, huge, {"Content-Type": "application/json"})]))
    gw = start(start_gateway, hostile, **limits(max_body_mib=1))
    resp = chat(gw)
    assert resp.status_code == 502
    assert error_of(resp)["code"] == "upstream_response_too_large"
    record = last_record(gw)
    assert outcomes(record["attempt_log"]) == [
        {"status": 502, "code": "upstream_response_too_large"}
    ]
    assert len(hostile.requests) == 1


def test_a_declared_length_past_the_limit_is_refused_before_the_body(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    huge = head(200, {"Content-Type": "application/json", "Content-Length": str(1 << 40)})
    hostile.queue(Play([huge, b'{"id": '], then="hold"))
    gw = start(start_gateway, hostile, **limits(max_body_mib=1))
    started = time.monotonic()
    resp = chat(gw)
    assert time.monotonic() - started < 3  # not a wait for a body that will never come
    assert resp.status_code == 502
    assert error_of(resp)["code"] == "upstream_response_too_large"
    assert hostile.client_left.wait(5)


def test_a_stream_line_that_never_ends_before_content(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    endless = b"data: " + b"a" * (3 << 20)
    hostile.queue(Play([stream_head(), endless], then="hold"))
    gw = start(start_gateway, hostile, **limits(max_event_mib=1))
    resp = chat(gw, stream=True)
    assert resp.status_code == 502
    error = error_of(resp)
    assert error["code"] == "upstream_response_too_large"
    assert "inference.upstream_limits.max_event_mib (1 MiB)" in error["message"]
    assert hostile.client_left.wait(5)  # the upstream's answer is closed
    assert last_record(gw)["http_status"] == 502


def test_a_compressed_stream_that_inflates_past_the_event_limit_after_content(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    shown = chunk({"role": "assistant", "content": "Hello"})
    bomb = gzip_bomb(64, prefix=shown + b"data: ")
    headers = {"Content-Encoding": "gzip"}
    hostile.queue(Play([stream_head(headers), bomb], then="hold"))
    gw = start(start_gateway, hostile, **limits(max_event_mib=2))
    client = gw.client()
    stream = client.chat.completions.create(model="hostile", messages=HELLO, stream=True)
    seen: list[str] = []
    with pytest.raises(openai.APIError) as info:
        for part in stream:
            seen.append(part.choices[0].delta.content or "")
    assert "".join(seen) == "Hello"
    assert "max_event_mib (2 MiB)" in info.value.message
    record = last_record(gw)
    assert (record["http_status"], record["error_code"]) == (502, "upstream_response_too_large")
    assert_still_serving(gw)


def test_a_response_head_past_its_limit(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    big = head(200, {"X-Padding": "p" * (100 << 10), "Content-Length": "2"}) + b"{}"
    hostile.queue(Play([big]))
    gw = start(start_gateway, hostile, **limits(max_header_kib=16))
    resp = chat(gw)
    assert resp.status_code == 502
    error = error_of(resp)
    assert error["code"] == "upstream_response_too_large"
    assert "inference.upstream_limits.max_header_kib (16 KiB)" in error["message"]
    assert last_record(gw)["attempts"] == 1


# -- the response head's deadline


def test_a_head_trickled_in_ends_at_the_header_deadline(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    trickle: list[bytes | float] = []
    for byte in head(200, {"Content-Length": "2"}):
        trickle += [bytes([byte]), 0.2]
    hostile.queue(Play(trickle))
    gw = start(start_gateway, hostile, attempts=1, **limits(header_timeout_s=0.5))
    started = time.monotonic()
    resp = chat(gw)
    assert time.monotonic() - started < 3  # not the 5 s read timeout, nor the whole trickle
    assert resp.status_code == 504
    error = error_of(resp)
    assert error["code"] == "upstream_timeout"
    assert "inference.upstream_limits.header_timeout_s (0.5 s)" in error["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_slow_first_byte_is_not_cut_by_the_header_deadline(
    start_gateway: GatewayFactory, hostile: HostileUpstream, stream: bool
) -> None:
    """llama-server sends its head with the whole answer (or the first token): a long
    generation is a long wait for the first byte, under ``read_timeout_s`` only."""
    if stream:
        answer = openai_stream(["Hello", " there"])
        hostile.queue(Play([1.5, *answer.steps]))
    else:
        hostile.queue(Play([1.5, whole(200, orjson.dumps(completion("Hello there")))]))
    gw = start(start_gateway, hostile, **limits(header_timeout_s=0.5))
    client = gw.client()
    if stream:
        parts = client.chat.completions.create(model="hostile", messages=HELLO, stream=True)
        text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    else:
        reply = client.chat.completions.create(model="hostile", messages=HELLO)
        text = reply.choices[0].message.content or ""
    assert text == "Hello there"


# -- statuses


@pytest.mark.parametrize("status", [101, 102, 204, 301, 302, 304, 600, 999])
def test_a_status_that_is_no_answer_is_a_502_naming_it(
    start_gateway: GatewayFactory, hostile: HostileUpstream, status: int
) -> None:
    headers = {"Location": "http://127.0.0.1:1/elsewhere", "Content-Length": "0"}
    if status == 101:
        headers = {"Upgrade": "websocket", "Connection": "Upgrade"}
    hostile.queue(Play([head(status, headers)], then="hold"))
    gw = start(start_gateway, hostile)
    resp = chat(gw)
    assert resp.status_code == 502
    error = error_of(resp)
    assert error["code"] == "malformed_response"
    assert f"HTTP status {status}" in error["message"]
    record = last_record(gw)
    assert (record["http_status"], record["error_code"]) == (502, "malformed_response")
    assert record["attempts"] == 1 and len(hostile.requests) == 1


def test_a_3xx_reaches_an_sdk_caller_as_an_error(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    hostile.queue(Play([head(302, {"Location": "/v2", "Content-Length": "0"})]))
    gw = start(start_gateway, hostile)
    with pytest.raises(openai.InternalServerError) as info:
        gw.client().chat.completions.create(model="hostile", messages=HELLO)
    assert info.value.status_code == 502 and "HTTP status 302" in info.value.message


def test_interim_responses_are_skipped(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    answer = whole(200, orjson.dumps(completion("after the interim")))
    early = head(103, {"Link": "</style.css>; rel=preload"}, "Early Hints")
    hostile.queue(Play([head(100, reason="Continue"), early, 0.2, answer]))
    gw = start(start_gateway, hostile)
    reply = gw.client().chat.completions.create(model="hostile", messages=HELLO)
    assert reply.choices[0].message.content == "after the interim"


# -- events written over several data: lines


def multi_line(event: bytes) -> bytes:
    """The event's JSON split over several data: lines, before each key (where a line
    break is whitespace, not inside a string)."""
    payload = event.removeprefix(b"data: ").removesuffix(b"\n\n")
    return b"data: " + payload.replace(b',"', b',\ndata: "') + b"\n\n"


def test_an_event_over_several_data_lines_reaches_the_caller_as_one_valid_event(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    events = [e for e in openai_stream(["Hello", ", ", "world"]).steps if isinstance(e, bytes)]
    split: list[bytes | float] = [
        events[0],
        *(multi_line(e) if e.startswith(b"data: {") else e for e in events[1:]),
    ]
    hostile.queue(Play(split), Play(split))
    gw = start(start_gateway, hostile)
    resp = chat(gw, stream=True)
    assert resp.status_code == 200
    lines = [line for line in resp.content.split(b"\n") if line]
    assert lines and all(line.startswith(b"data: ") for line in lines)
    payloads = [line.removeprefix(b"data: ") for line in lines]
    assert payloads[-1] == b"[DONE]"
    chunks = [orjson.loads(p) for p in payloads[:-1]]  # each one line of valid JSON
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == (
        "Hello, world"
    )
    # and the SDK reads it as any other stream
    parts = gw.client().chat.completions.create(model="hostile", messages=HELLO, stream=True)
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == ("Hello, world")


# -- the call's deadline


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed-before-content"])
def test_an_answer_past_max_call_s_before_content_is_a_504(
    start_gateway: GatewayFactory, hostile: HostileUpstream, stream: bool
) -> None:
    if stream:
        hostile.queue(Play([4.0, *openai_stream(["late"]).steps]))
    else:
        hostile.queue(Play([4.0, whole(200, orjson.dumps(completion("late")))]))
    gw = start(start_gateway, hostile, max_call_s=0.5)
    started = time.monotonic()
    resp = chat(gw, stream=stream)
    assert time.monotonic() - started < 3
    assert resp.status_code == 504
    error = error_of(resp)
    assert error["code"] == "upstream_timeout"
    assert "inference.max_call_s (0.5 s)" in error["message"]
    record = last_record(gw)
    assert (record["http_status"], record["error_code"]) == (504, "upstream_timeout")
    assert outcomes(record["attempt_log"]) == [{"status": 504, "code": "upstream_timeout"}]
    assert hostile.client_left.wait(5)


def test_a_stream_past_max_call_s_after_content_ends_in_an_in_stream_error(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    steps: list[bytes | float] = [stream_head(), chunk({"role": "assistant", "content": "Hi"})]
    for _ in range(30):
        steps += [0.3, chunk({"content": " more"})]
    hostile.queue(Play(steps))
    gw = start(start_gateway, hostile, max_call_s=1.5)
    started = time.monotonic()
    resp = chat(gw, stream=True)
    assert time.monotonic() - started < 4
    assert resp.status_code == 200
    events = parse_sse(resp.content)
    assert "[DONE]" not in events
    assert events[-1]["error"]["code"] == "upstream_timeout"
    assert "inference.max_call_s (1.5 s)" in events[-1]["error"]["message"]
    assert events[0]["choices"][0]["delta"]["content"] == "Hi"
    record = last_record(gw)
    assert (record["http_status"], record["error_code"]) == (504, "upstream_timeout")
    assert outcomes(record["attempt_log"])[-1] == {"status": 504, "code": "upstream_timeout"}
    assert hostile.client_left.wait(5)


def test_an_sdk_caller_sees_the_deadline_in_a_stream(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    steps: list[bytes | float] = [stream_head(), chunk({"role": "assistant", "content": "Hi"})]
    steps += [5.0, chunk({"content": "late"})]
    hostile.queue(Play(steps))
    gw = start(start_gateway, hostile, max_call_s=1.0)
    stream = gw.client().chat.completions.create(model="hostile", messages=HELLO, stream=True)
    with pytest.raises(openai.APIError, match=r"inference\.max_call_s"):
        for _ in stream:
            pass


def test_a_call_within_max_call_s_is_untouched(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    hostile.queue(openai_stream(["quick"]), json_play(200, completion("quick too")))
    gw = start(start_gateway, hostile, max_call_s=30)
    client = gw.client()
    parts = client.chat.completions.create(model="hostile", messages=HELLO, stream=True)
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == "quick"
    reply = client.chat.completions.create(model="hostile", messages=HELLO)
    assert reply.choices[0].message.content == "quick too"
    assert [c["status"] for c in gw.calls()] == ["ok", "ok"]


# -- a caller that stops reading


def test_a_caller_that_stops_reading_is_dropped_and_the_upstream_closed(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    piece = chunk({"content": "z" * (64 << 10)})
    steps: list[bytes | float] = [stream_head(), chunk({"role": "assistant", "content": "a"})]
    steps += [piece] * 800  # 50 MiB: more than every buffer on the way holds
    hostile.queue(Play(steps))
    gw = start(start_gateway, hostile, write_stall_s=0.5)
    body = orjson.dumps({"model": "hostile", "messages": HELLO, "stream": True})
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    with socket.socket() as caller:
        caller.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        caller.connect((gw.server.host, gw.server.port))
        caller.sendall(request)
        # the caller reads nothing: the gateway must give up on it, not wait forever
        assert hostile.client_left.wait(20), "the upstream's answer was never closed"
        deadline = time.monotonic() + 10
        while not gw.calls():
            assert time.monotonic() < deadline, "the call was not recorded"
            time.sleep(0.05)
    record = last_record(gw)
    assert (record["http_status"], record["error_code"]) == (499, "client_disconnected")
    assert_still_serving(gw)
