"""What is kept of one streamed answer is bounded: every translator and the tool-call
hold raise ``ResponseTooLarge`` naming ``max_captured_mib`` once an answer's kept pieces
(each counted with its bookkeeping) pass it, and not before."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import pytest

from boundedcode_gateway.errors import ResponseTooLarge
from boundedcode_gateway.providers.anthropic.stream import AnthropicStreamTranslator
from boundedcode_gateway.providers.base import RequestOptions, StreamTranslator
from boundedcode_gateway.providers.gemini.stream import GeminiStreamTranslator
from boundedcode_gateway.providers.openai_compat.stream import OpenAIStreamTranslator
from boundedcode_gateway.tool_call_hold import ToolCallHold
from boundedcode_gateway.upstream.metrics import PIECE_COST, CaptureLimit

LIMIT = 64 << 10
# pieces of one letter: each costs 1 + PIECE_COST
FITS = LIMIT // (1 + PIECE_COST) - 8
PAST = LIMIT // (1 + PIECE_COST) + 8


def options(limit: int = LIMIT) -> RequestOptions:
    return RequestOptions(
        stream=True,
        include_usage=False,
        return_progress=False,
        capture_reasoning=True,
        capture_content=True,
        max_captured_bytes=limit,
    )


def openai_chunk(delta: dict[str, Any]) -> bytes:
    return orjson.dumps({"id": "c", "choices": [{"index": 0, "delta": delta}]})


def anthropic_event(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj)


ANTHROPIC_OPEN = [
    {"type": "message_start", "message": {"id": "msg_1", "model": "claude", "usage": {}}},
]


def _anthropic(block: dict[str, Any], delta: dict[str, Any]) -> tuple[list[Any], Any]:
    start = {"type": "content_block_start", "index": 0, "content_block": block}
    return [*ANTHROPIC_OPEN, start], {"type": "content_block_delta", "index": 0, "delta": delta}


Translator = StreamTranslator | ToolCallHold
# (translator, its opening events, the event repeated)
Case = tuple[Callable[[RequestOptions], Translator], list[bytes], bytes]


def cases() -> dict[str, Case]:
    def openai(o: RequestOptions) -> StreamTranslator:
        return OpenAIStreamTranslator(o)

    def held(o: RequestOptions) -> Translator:
        return ToolCallHold(OpenAIStreamTranslator(o), CaptureLimit(o.max_captured_bytes))

    def anthropic(o: RequestOptions) -> StreamTranslator:
        return AnthropicStreamTranslator(o)

    def gemini(o: RequestOptions) -> StreamTranslator:
        return GeminiStreamTranslator(o, "gemini-3")

    head = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f"}}
    arguments = {"tool_calls": [{"index": 0, "function": {"arguments": "a"}}]}
    out: dict[str, Case] = {
        "openai content": (openai, [], openai_chunk({"content": "a"})),
        "openai reasoning": (openai, [], openai_chunk({"reasoning_content": "r"})),
        "held tool-call arguments": (
            held,
            [openai_chunk({"tool_calls": [head]})],
            openai_chunk(arguments),
        ),
    }
    for name, block, delta in [
        ("anthropic text", {"type": "text", "text": ""}, {"type": "text_delta", "text": "a"}),
        (
            "anthropic thinking",
            {"type": "thinking", "thinking": ""},
            {"type": "thinking_delta", "thinking": "t"},
        ),
        (
            "anthropic tool input",
            {"type": "tool_use", "id": "toolu_1", "name": "f"},
            {"type": "input_json_delta", "partial_json": "a"},
        ),
    ]:
        opening, repeated = _anthropic(block, delta)
        out[name] = (anthropic, [orjson.dumps(e) for e in opening], orjson.dumps(repeated))
    gemini_part = {"candidates": [{"content": {"parts": [{"text": "a"}]}}]}
    out["gemini text"] = (gemini, [], orjson.dumps(gemini_part))
    return out


CASES = cases()


def feed(t: Translator, events: Sequence[bytes]) -> None:
    for event in events:
        t.feed("", event)


@pytest.mark.parametrize("name", list(CASES))
def test_an_answer_that_keeps_more_than_the_limit_is_too_large(name: str) -> None:
    new, opening, repeated = CASES[name]
    t = new(options())
    feed(t, opening)
    with pytest.raises(ResponseTooLarge, match=r"max_captured_mib \(0\.0625 MiB\)"):
        feed(t, [repeated] * PAST)


@pytest.mark.parametrize("name", list(CASES))
def test_an_answer_within_the_limit_is_relayed(name: str) -> None:
    new, opening, repeated = CASES[name]
    t = new(options())
    feed(t, opening + [repeated] * FITS)


def test_a_stream_of_new_tool_calls_is_bounded_too() -> None:
    t = ToolCallHold(OpenAIStreamTranslator(options()), CaptureLimit(LIMIT))
    calls = (openai_chunk({"tool_calls": [{"index": i}]}) for i in range(LIMIT // PIECE_COST + 1))
    with pytest.raises(ResponseTooLarge):
        feed(t, list(calls))


def test_a_thinking_block_of_many_deltas_is_joined_once() -> None:
    # each delta was added to the block's text, copied whole each time: quadratic (11.7 s
    # for these 100,000 deltas)
    opening, repeated = _anthropic(
        {"type": "thinking", "thinking": ""}, {"type": "thinking_delta", "thinking": "t" * 8}
    )
    t = AnthropicStreamTranslator(options(32 << 20))
    feed(t, [orjson.dumps(e) for e in opening])
    event = orjson.dumps(repeated)
    started = time.perf_counter()
    feed(t, [event] * 100_000)
    stop = orjson.dumps({"type": "content_block_stop", "index": 0})
    feed(t, [stop, orjson.dumps({"type": "message_stop"})])
    took = time.perf_counter() - started
    captured = t.metrics.captured
    assert captured is not None
    assert captured.data[0][1]["thinking"] == "t" * 800_000
    assert took < 5.0, f"{took:.1f} s"
