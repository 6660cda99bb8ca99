"""The Gemini stream translator: golden chunks, the end of a stream, errors, and parity with
the non-streamed answer over random chunkings."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boundedcode_gateway.errors import GatewayError, MalformedResponse
from boundedcode_gateway.providers.base import RequestOptions
from boundedcode_gateway.providers.gemini.response import from_gemini_response
from boundedcode_gateway.providers.gemini.stream import GeminiStreamTranslator
from boundedcode_gateway.upstream.metrics import CallMetrics

OPTIONS = RequestOptions(
    stream=True,
    include_usage=True,
    return_progress=False,
    capture_reasoning=True,
    capture_content=True,
)
USAGE = {"promptTokenCount": 10, "candidatesTokenCount": 4, "thoughtsTokenCount": 3}


def chunk(parts: list[Any], finish: str | None = None, usage: Any = None) -> bytes:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}}
    if finish:
        candidate["finishReason"] = finish
    obj: dict[str, Any] = {"candidates": [candidate], "responseId": "r1", "modelVersion": "gm"}
    if usage:
        obj["usageMetadata"] = usage
    return orjson.dumps(obj)


def run(events: list[bytes], options: RequestOptions = OPTIONS) -> tuple[list[Any], Any]:
    t = GeminiStreamTranslator(options, "gemini-3")
    out = [orjson.loads(p) for e in events for p in t.feed("", e)]
    return out, t


def test_golden_stream_with_signature_only_final_part() -> None:
    events = [
        chunk([{"text": "Plan.", "thought": True}]),
        chunk([{"text": "Hel"}]),
        chunk([{"text": "lo."}]),
        chunk([{"text": "", "thoughtSignature": "U0lH"}], "STOP", USAGE),
    ]
    out, t = run(events)
    assert {c["id"] for c in out} == {"chatcmpl-r1"}
    assert {c["model"] for c in out} == {"gm"}
    deltas = [c["choices"][0]["delta"] for c in out if c["choices"]]
    assert deltas == [
        {"role": "assistant", "reasoning_content": "Plan."},
        {"content": "Hel"},
        {"content": "lo."},
        {},
    ]
    assert out[3]["choices"][0]["finish_reason"] == "stop"
    assert out[4]["choices"] == [] and out[4]["usage"]["completion_tokens"] == 7
    assert t.finished and t.content_started
    assert t.metrics.captured.data == {"slots": [[-1, "U0lH"]], "ids": False}
    assert t.metrics.captured.text == "Hello."
    assert t.metrics.answer_text == "Hello."


def test_parallel_calls_stream_with_the_signature_on_the_first() -> None:
    events = [
        chunk([{"functionCall": {"name": "a", "args": {"x": 1}}, "thoughtSignature": "QQ=="}]),
        chunk([{"functionCall": {"name": "b", "args": {}}}], "STOP", USAGE),
    ]
    out, t = run(events)
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in out[:2]]
    assert [(c["index"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        (0, "a", '{"x":1}'),
        (1, "b", "{}"),
    ]
    assert out[2]["choices"][0]["finish_reason"] == "tool_calls"
    assert t.metrics.captured.tool_call_ids == [c["id"] for c in calls]
    assert t.metrics.captured.data["slots"] == [[0, "QQ=="]]


def test_a_signature_alone_is_not_content() -> None:
    _, t = run([chunk([{"text": "", "thoughtSignature": "U0lH"}])])
    assert not t.content_started and not t.finished


def test_no_usage_chunk_unless_asked() -> None:
    options = RequestOptions(stream=True, include_usage=False, return_progress=False)
    out, t = run([chunk([{"text": "x"}], "STOP", USAGE)], options)
    assert [c["choices"][0]["finish_reason"] for c in out] == [None, "stop"]
    assert t.metrics.prompt_tokens == 10 and t.metrics.captured is None


def test_a_stream_without_finish_reason_is_not_finished() -> None:
    _, t = run([chunk([{"text": "Hello"}]), chunk([{"text": " there"}], usage=USAGE)])
    assert t.content_started and not t.finished


@pytest.mark.parametrize("as_array", [False, True])
def test_error_payload_raises(as_array: bool) -> None:
    error: Any = {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}
    t = GeminiStreamTranslator(OPTIONS, "gemini-3")
    with pytest.raises(GatewayError) as info:
        t.feed("", orjson.dumps([error] if as_array else error))
    assert info.value.http_status == 503


def test_error_without_a_status_is_a_502() -> None:
    t = GeminiStreamTranslator(OPTIONS, "gemini-3")
    with pytest.raises(GatewayError) as info:
        t.feed("", b'[{"error": {"message": "stream aborted"}}]')
    assert info.value.http_status == 502 and info.value.message == "stream aborted"


def test_malformed_events() -> None:
    t = GeminiStreamTranslator(OPTIONS, "gemini-3")
    with pytest.raises(MalformedResponse):
        t.feed("", b"not json")
    with pytest.raises(MalformedResponse):
        t.feed("", b"[1]")


def test_malformed_function_call_in_a_stream() -> None:
    t = GeminiStreamTranslator(OPTIONS, "gemini-3")
    with pytest.raises(MalformedResponse) as info:
        t.feed("", chunk([], "MALFORMED_FUNCTION_CALL"))
    assert info.value.code == "malformed_function_call"


# -- parity: any chunking of an answer streams what the whole answer says

texts = st.text(alphabet="abc xyz.,", min_size=0, max_size=30)
call_st = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["read", "list", "write"]),
        "args": st.dictionaries(st.sampled_from("pqr"), st.integers(0, 9), max_size=2),
    }
)


@st.composite
def answers(draw: st.DrawFn) -> tuple[list[dict[str, Any]], str, bool]:
    """The parts of an answer as Gemini writes them whole, its finish reason, native ids."""
    native = draw(st.booleans())
    parts: list[dict[str, Any]] = []
    thought = draw(texts)
    if thought:
        parts.append({"text": thought, "thought": True})
    text = draw(texts)
    if text:
        parts.append({"text": text})
    calls = draw(st.lists(call_st, max_size=3))
    for i, fc in enumerate(calls):
        part: dict[str, Any] = {"functionCall": {**fc, **({"id": f"fc{i}"} if native else {})}}
        parts.append(part)
    if calls:
        parts[-len(calls)]["thoughtSignature"] = "c2ln"
    elif parts:
        parts[-1]["thoughtSignature"] = "dGV4dA=="
    return parts, draw(st.sampled_from(["STOP", "MAX_TOKENS", "SAFETY"])), native


def stream_parts(parts: list[dict[str, Any]], cuts: list[int]) -> list[dict[str, Any]]:
    """The same answer as a stream splits it: texts cut into pieces, a signature on the
    text answer's last piece moved to a signature-only part."""
    out: list[dict[str, Any]] = []
    for part in parts:
        if "functionCall" in part:
            out.append(part)
            continue
        text, rest = part["text"], {k: v for k, v in part.items() if k != "text"}
        sig = rest.pop("thoughtSignature", None)
        points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
        out += [{"text": text[a:b], **rest} for a, b in itertools.pairwise(points)]
        if sig is not None:
            out.append({"text": "", "thoughtSignature": sig})
    return out


def group(parts: list[Any], sizes: list[int]) -> list[list[Any]]:
    groups, i = [], 0
    for size in sizes:
        if i >= len(parts):
            break
        groups.append(parts[i : i + size])
        i += size
    if i < len(parts):
        groups.append(parts[i:])
    return groups


def normal(tool_calls: list[dict[str, Any]], native: bool) -> list[Any]:
    return [
        (c["id"] if native else "", c["function"]["name"], c["function"]["arguments"])
        for c in tool_calls
    ]


@settings(max_examples=50, deadline=None)
@given(
    answer=answers(),
    cuts=st.lists(st.integers(0, 40), max_size=4),
    sizes=st.lists(st.integers(1, 3), max_size=8),
)
def test_stream_and_whole_answer_agree(
    answer: tuple[list[dict[str, Any]], str, bool], cuts: list[int], sizes: list[int]
) -> None:
    parts, reason, native = answer
    whole_metrics = CallMetrics()
    whole_raw = orjson.dumps(
        {
            "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": reason}],
            "usageMetadata": USAGE,
        }
    )
    whole = orjson.loads(from_gemini_response(whole_raw, whole_metrics, OPTIONS, "g"))
    message = whole["choices"][0]["message"]

    groups = group(stream_parts(parts, cuts), sizes) or [[]]
    events = [chunk(g) for g in groups[:-1]] + [chunk(groups[-1], reason, USAGE)]
    out, t = run(events)
    assert t.finished
    deltas = [c["choices"][0] for c in out if c["choices"]]
    content = "".join(d["delta"].get("content") or "" for d in deltas)
    reasoning = [
        d["delta"]["reasoning_content"] for d in deltas if "reasoning_content" in d["delta"]
    ]
    streamed_calls = [tc for d in deltas for tc in d["delta"].get("tool_calls") or ()]

    assert content == (message["content"] or "")
    assert ("".join(reasoning) if reasoning else None) == message.get("reasoning_content")
    assert normal(streamed_calls, native) == normal(message.get("tool_calls") or [], native)
    assert deltas[-1]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert out[-1]["usage"] == whole["usage"]
    if whole_metrics.captured is None:
        assert t.metrics.captured is None
    else:
        assert t.metrics.captured is not None
        assert t.metrics.captured.data == whole_metrics.captured.data
        assert t.metrics.captured.text == whole_metrics.captured.text
        assert len(t.metrics.captured.tool_call_ids) == len(whole_metrics.captured.tool_call_ids)
