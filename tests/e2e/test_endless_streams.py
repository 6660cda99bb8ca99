"""Streamed answers that never end: small chunks of text, of reasoning, or of one tool
call's arguments, sent as fast as the gateway reads them (``read_timeout_s`` never fires).

What the gateway keeps of an answer while it streams (its text and reasoning for the
reasoning store or a continuation, the tool calls it holds until the finish) is bounded
by ``inference.upstream_limits.max_captured_mib`` and the answer's bytes by
``max_stream_mib``, both set by default: the call is cut with
``upstream_response_too_large`` naming the limit, in seconds, and the gateway's memory
stays bounded. A long answer that ends is untouched.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.e2e.conftest import Gateway, GatewayFactory
from tests.fakes.hostile import HostileUpstream, Play, Step, chunk, stream_head
from tests.memory import GROWTH_LIMIT, PeakRss

KEY_ENV = "ENDLESS_UPSTREAM_KEY"
# what an endless answer may stream before the test gives up on it (each step one more
# reference to the same piece: the upstream holds no copy of the whole)
ENDLESS_BYTES = 4 << 30
PIECE_BYTES = 64 << 10
# how long the gateway may take to cut it (it streamed on for minutes before)
CUT_WITHIN_S = 60.0


@pytest.fixture
def hostile(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostileUpstream]:
    monkeypatch.setenv(KEY_ENV, "sk-endless-test-key")
    upstream = HostileUpstream().start()
    yield upstream
    upstream.stop()


def start(
    start_gateway: GatewayFactory,
    upstream: HostileUpstream,
    reasoning_history: str = "keep",
    **limits: Any,
) -> Gateway:
    # an OpenAI-compatible API that takes reasoning back: the gateway keeps each answer's
    # text and reasoning for the next turn
    profile = {
        "provider": "openai-compatible",
        "model": "glm-5",
        "api_key_env": KEY_ENV,
        "base_url": upstream.url + "/v1",
        "retry": {"max_attempts": 1},
    }
    inference = {
        "read_timeout_s": 10,
        "reasoning_history": reasoning_history,
        "upstream_limits": limits,
    }
    return start_gateway({"endless": profile}, inference=inference)


def endless(delta: dict[str, Any], first: dict[str, Any] | None = None) -> list[Step]:
    """An answer that goes on with ``delta`` (after ``first``) and never finishes."""
    one = chunk(delta, model="glm-5")
    piece = one * (PIECE_BYTES // len(one))
    opening = [chunk(first, model="glm-5")] if first else []
    return [stream_head(), *opening, *[piece] * (ENDLESS_BYTES // len(piece))]


ARGUMENTS_HEAD = {
    "tool_calls": [
        {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "write_file", "arguments": '{"text": "'},
        }
    ]
}
ENDLESS = {
    "content": endless({"content": "a"}, {"role": "assistant", "content": ""}),
    "reasoning": endless({"reasoning_content": "r"}, {"role": "assistant", "content": ""}),
    "tool-call arguments": endless(
        {"tool_calls": [{"index": 0, "function": {"arguments": "a"}}]}, ARGUMENTS_HEAD
    ),
}


def stream(gw: Gateway) -> tuple[int, bytes, int]:
    """The status, the end of what the gateway sent (its last event) and how much it sent,
    read as it comes and not kept."""
    body = {"model": "endless", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    tail, size = b"", 0
    deadline = time.monotonic() + CUT_WITHIN_S
    with (
        httpx.Client(timeout=CUT_WITHIN_S) as client,
        client.stream("POST", gw.url + "/v1/chat/completions", json=body) as resp,
    ):
        for data in resp.iter_bytes():
            size += len(data)
            tail = (tail + data)[-4096:]
            if time.monotonic() > deadline:
                break  # still streaming: the test fails on what it got
        return resp.status_code, tail, size


def last_event(tail: bytes) -> dict[str, Any]:
    events = [e for e in tail.split(b"\n\n") if e.startswith(b"data: {")]
    event: dict[str, Any] = orjson.loads(events[-1][6:])
    return event


def cut(gw: Gateway) -> tuple[int, dict[str, Any], int, float]:
    httpx.get(gw.url + "/health", timeout=10)  # the gateway's own first-use costs
    started = time.monotonic()
    with PeakRss() as rss:
        status, tail, size = stream(gw)
    took = time.monotonic() - started
    print(
        f"{status}, {size / 1e6:.0f} MB relayed, +{rss.growth / (1 << 20):.1f} MiB in {took:.1f} s"
    )
    error = last_event(tail).get("error") if status == 200 else orjson.loads(tail)["error"]
    assert isinstance(error, dict), tail[-300:]
    return status, error, rss.growth, took


@pytest.mark.parametrize("kind", list(ENDLESS))
def test_an_endless_answer_is_cut_at_what_it_may_keep(
    start_gateway: GatewayFactory, hostile: HostileUpstream, kind: str
) -> None:
    hostile.queue(Play(ENDLESS[kind]))
    gw = start(start_gateway, hostile)
    status, error, growth, took = cut(gw)
    # text or reasoning was shown: the in-stream error; held tool calls alone: an HTTP 502
    assert status == (502 if kind == "tool-call arguments" else 200)
    assert error["code"] == "upstream_response_too_large"
    assert "inference.upstream_limits.max_captured_mib (32 MiB)" in error["message"]
    assert growth < GROWTH_LIMIT, f"grew by {growth / (1 << 20):.0f} MiB"
    assert took < CUT_WITHIN_S
    assert hostile.client_left.wait(10)
    assert [(c["http_status"], c["error_code"]) for c in gw.calls()] == [
        (502, "upstream_response_too_large")
    ]


def test_an_endless_answer_nothing_is_kept_of_is_cut_at_the_stream_limit(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    # text the gateway keeps nothing of (no reasoning comes back to it, no schema) is
    # bounded by the answer's bytes: 256 MiB by default, 16 here to be quick
    hostile.queue(Play(ENDLESS["content"]))
    gw = start(start_gateway, hostile, reasoning_history="drop", max_stream_mib=16)
    status, error, growth, took = cut(gw)
    assert status == 200
    assert error["code"] == "upstream_response_too_large"
    assert "inference.upstream_limits.max_stream_mib (16 MiB)" in error["message"]
    assert growth < GROWTH_LIMIT
    assert took < CUT_WITHIN_S
    assert hostile.client_left.wait(10)


def test_a_long_answer_that_ends_is_untouched(
    start_gateway: GatewayFactory, hostile: HostileUpstream
) -> None:
    # 60k pieces of reasoning, 60k of text and a tool call of 400 KB: a long agent turn
    pieces = [chunk({"role": "assistant", "content": ""}, model="glm-5")]
    pieces += [chunk({"reasoning_content": "abcd"}, model="glm-5")] * 60_000
    pieces += [chunk({"content": "efgh"}, model="glm-5")] * 60_000
    pieces.append(chunk(ARGUMENTS_HEAD, model="glm-5"))
    argument = {"tool_calls": [{"index": 0, "function": {"arguments": "x" * 4000}}]}
    pieces += [chunk(argument, model="glm-5")] * 100
    closing = {"tool_calls": [{"index": 0, "function": {"arguments": '"}'}}]}
    pieces += [chunk(closing, model="glm-5"), chunk({}, "tool_calls", model="glm-5")]
    hostile.queue(Play([stream_head(), b"".join(pieces), b"data: [DONE]\n\n"]))
    gw = start(start_gateway, hostile)
    status, tail, size = stream(gw)
    assert status == 200
    assert tail.endswith(b"data: [DONE]\n\n")
    assert size > 120_000 * 100
    assert [(c["http_status"], c["error_code"]) for c in gw.calls()] == [(200, None)]
