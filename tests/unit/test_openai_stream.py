"""The pass-through stream translator: what it relays, drops, measures and raises."""

from __future__ import annotations

import orjson
import pytest

from boundedcode_gateway.errors import ContextLengthExceeded, MalformedResponse, UpstreamFailure
from boundedcode_gateway.providers.base import RequestOptions
from boundedcode_gateway.providers.openai_compat.stream import OpenAIStreamTranslator


def chunk(**fields: object) -> bytes:
    base: dict[str, object] = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "qwen",
    }
    return orjson.dumps({**base, **fields})


ROLE = chunk(
    choices=[{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]
)
PROGRESS = chunk(
    choices=[{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}],
    prompt_progress={"total": 100, "cache": 60, "processed": 80, "time_ms": 12},
)
TEXT = chunk(choices=[{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}])
FINISH = chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])
USAGE = chunk(
    choices=[],
    usage={
        "prompt_tokens": 100,
        "completion_tokens": 2,
        "total_tokens": 102,
        "prompt_tokens_details": {"cached_tokens": 60},
    },
    timings={
        "cache_n": 60,
        "prompt_n": 40,
        "prompt_ms": 80.0,
        "predicted_n": 2,
        "predicted_ms": 20.0,
    },
)


def run(options: RequestOptions, events: list[bytes]) -> tuple[OpenAIStreamTranslator, list[bytes]]:
    t = OpenAIStreamTranslator(options)
    out: list[bytes] = []
    for data in events:
        out += t.feed("", data)
    return t, out


def test_llama_stream_relayed_unchanged_and_measured() -> None:
    opts = RequestOptions(stream=True, include_usage=True, return_progress=True)
    t, out = run(opts, [PROGRESS, ROLE, TEXT, FINISH, USAGE, b"[DONE]"])
    assert out == [PROGRESS, ROLE, TEXT, FINISH, USAGE]
    assert t.finished and t.content_started and t.progress_seen
    m = t.metrics
    assert (m.prompt_tokens, m.cached_tokens, m.evaluated_tokens) == (100, 60, 40)
    assert (m.prefill_ms, m.decode_ms, m.finish_reason) == (80.0, 20.0, "stop")


def test_usage_and_progress_dropped_unless_asked() -> None:
    opts = RequestOptions(stream=True, include_usage=False, return_progress=False)
    t, out = run(opts, [PROGRESS, ROLE, TEXT, FINISH, USAGE, b"[DONE]"])
    assert out == [ROLE, TEXT, FINISH]
    assert t.metrics.prompt_tokens == 100  # still measured


def test_role_chunk_is_not_content() -> None:
    t, _ = run(RequestOptions(True, False, False), [ROLE])
    assert not t.content_started and not t.finished


@pytest.mark.parametrize(
    "delta",
    [
        {"reasoning_content": "hm"},
        {"refusal": "no"},
        {"tool_calls": [{"index": 0, "id": "call_1"}]},
    ],
)
def test_reasoning_tool_calls_and_refusals_are_content(delta: dict[str, object]) -> None:
    data = chunk(choices=[{"index": 0, "delta": delta, "finish_reason": None}])
    t, _ = run(RequestOptions(True, False, False), [data])
    assert t.content_started


def test_done_alone_ends_the_stream() -> None:
    t, out = run(RequestOptions(True, False, False), [ROLE, TEXT, b"[DONE]"])
    assert t.finished and out == [ROLE, TEXT]


@pytest.mark.parametrize("progress", [False, True])
def test_an_answer_without_its_role_chunk_gets_one(progress: bool) -> None:
    # llama-server's role rides on the progress chunks when the first token is held back
    _, out = run(RequestOptions(True, False, progress), [PROGRESS, TEXT, FINISH])
    assert out == ([PROGRESS, TEXT, FINISH] if progress else [ROLE, TEXT, FINISH])


def test_llama_error_event_raises_with_its_status() -> None:
    data = orjson.dumps({"error": {"code": 500, "message": "boom", "type": "server_error"}})
    t = OpenAIStreamTranslator(RequestOptions(True, False, False))
    with pytest.raises(UpstreamFailure) as info:
        t.feed("", data)
    assert info.value.http_status == 500 and info.value.message == "boom"


def test_overflow_event_is_context_length_exceeded() -> None:
    data = orjson.dumps(
        {
            "error": {
                "code": 400,
                "type": "exceed_context_size_error",
                "message": "request (9 tokens) exceeds the available context "
                "size (8 tokens), try increasing it",
            }
        }
    )
    with pytest.raises(ContextLengthExceeded):
        OpenAIStreamTranslator(RequestOptions(True, False, False)).feed("", data)


def test_openai_error_event_without_status_is_502() -> None:
    data = orjson.dumps({"error": {"message": "server had an error", "type": "server_error"}})
    with pytest.raises(UpstreamFailure) as info:
        OpenAIStreamTranslator(RequestOptions(True, False, False)).feed("", data)
    assert info.value.http_status == 502


@pytest.mark.parametrize("data", [b"not json", b"[1]"])
def test_garbage_event_is_malformed(data: bytes) -> None:
    with pytest.raises(MalformedResponse):
        OpenAIStreamTranslator(RequestOptions(True, False, False)).feed("", data)


def test_an_event_over_several_data_lines_is_relayed_as_one_line() -> None:
    # the SSE decoder joins an event's data: lines with "\n", which only JSON whitespace
    # can be: relayed as is, the caller's data: line would end inside the object
    joined = TEXT.replace(b',"', b',\n"')
    assert b"\n" in joined
    t, out = run(RequestOptions(stream=True, include_usage=False, return_progress=False), [joined])
    assert out and all(b"\n" not in payload for payload in out)
    assert orjson.loads(out[-1]) == orjson.loads(TEXT)
    assert t.content_started


def test_a_finish_reason_that_is_no_string_ends_the_answer_unrecorded() -> None:
    odd = chunk(choices=[{"index": 0, "delta": {}, "finish_reason": {"why": "odd"}}])
    t, _ = run(RequestOptions(stream=True, include_usage=False, return_progress=False), [odd])
    assert t.finished and t.metrics.finish_reason is None
