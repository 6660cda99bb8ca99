"""Pure translation for OpenAI-shaped upstreams, with golden bodies from the wire reference."""

from __future__ import annotations

import orjson
import pytest

from boundedcode_gateway.errors import ContextLengthExceeded, MalformedResponse, UpstreamFailure
from boundedcode_gateway.providers.base import RequestOptions
from boundedcode_gateway.providers.openai_compat.dialects import (
    LLAMA_CPP,
    LOCAL_OPENAI_COMPATIBLE,
    OPENAI,
    OPENAI_COMPATIBLE,
)
from boundedcode_gateway.providers.openai_compat.mapping import (
    error_from_openai_compat,
    from_openai_compat_response,
    to_openai_compat_request,
)
from boundedcode_gateway.upstream.metrics import CallMetrics

STREAM = RequestOptions(stream=True, include_usage=False, return_progress=False)
PLAIN = RequestOptions(stream=False, include_usage=False, return_progress=False)
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object"}}},
]
HISTORY = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello", "reasoning_content": "greet back"},
    {"role": "user", "content": "bye", "reasoning_content": "never on a user turn"},
]


def test_unknown_fields_pass_through_and_usage_is_asked_for() -> None:
    body = {
        "model": "local",
        "messages": HISTORY[:1],
        "stream": True,
        "top_k": 40,
        "stream_options": {"include_obfuscation": False},
        "x_vendor": {"a": 1},
    }
    out = to_openai_compat_request(
        body, model="gpt-5.1", dialect=OPENAI, options=STREAM, takes_reasoning=False
    )
    assert out["model"] == "gpt-5.1"
    assert out["top_k"] == 40 and out["x_vendor"] == {"a": 1}
    assert out["stream_options"] == {"include_obfuscation": False, "include_usage": True}
    assert body["stream_options"] == {"include_obfuscation": False}  # caller's body untouched


def test_non_stream_gets_no_stream_options() -> None:
    body = {"model": "m", "messages": HISTORY[:1]}
    out = to_openai_compat_request(
        body, model="m", dialect=OPENAI, options=PLAIN, takes_reasoning=False
    )
    assert "stream_options" not in out


def test_reasoning_removed_where_not_taken() -> None:
    body = {"model": "m", "messages": HISTORY}
    out = to_openai_compat_request(
        body, model="m", dialect=OPENAI, options=PLAIN, takes_reasoning=False
    )
    assert all("reasoning_content" not in m for m in out["messages"])
    assert "reasoning_content" in HISTORY[1]  # the caller's message is not mutated


def test_reasoning_kept_on_assistant_turns_only_for_a_taker() -> None:
    body = {"model": "m", "messages": HISTORY}
    out = to_openai_compat_request(
        body, model="m", dialect=LLAMA_CPP, options=PLAIN, takes_reasoning=True
    )
    assert out["messages"][1]["reasoning_content"] == "greet back"
    assert "reasoning_content" not in out["messages"][2]


def test_llama_named_tool_choice_becomes_required_over_that_tool() -> None:
    body = {
        "model": "m",
        "messages": HISTORY[:1],
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "write_file"}},
    }
    out = to_openai_compat_request(
        body, model="m", dialect=LLAMA_CPP, options=PLAIN, takes_reasoning=False
    )
    assert out["tool_choice"] == "required"
    assert [t["function"]["name"] for t in out["tools"]] == ["write_file"]
    kept = to_openai_compat_request(
        body, model="m", dialect=OPENAI, options=PLAIN, takes_reasoning=False
    )
    assert kept["tool_choice"] == body["tool_choice"] and len(kept["tools"]) == 2


@pytest.mark.parametrize(
    ("dialect", "setting", "template", "expected"),
    [
        (LLAMA_CPP, "auto", True, True),
        (LLAMA_CPP, "auto", False, False),
        (LLAMA_CPP, "drop", True, False),
        (LOCAL_OPENAI_COMPATIBLE, "auto", False, False),
        (LOCAL_OPENAI_COMPATIBLE, "keep", False, True),
        (OPENAI, "keep", False, False),
        (OPENAI_COMPATIBLE, "auto", False, False),
        (OPENAI_COMPATIBLE, "keep", False, True),
    ],
)
def test_who_takes_reasoning(dialect, setting, template, expected) -> None:  # type: ignore[no-untyped-def]
    assert dialect.takes_reasoning(setting, template) is expected


LLAMA_RESPONSE = {
    "choices": [
        {
            "finish_reason": "stop",
            "index": 0,
            "message": {"role": "assistant", "content": "Hi", "reasoning_content": "r"},
        }
    ],
    "created": 1,
    "model": "qwen",
    "system_fingerprint": "b1-abc",
    "object": "chat.completion",
    "usage": {
        "completion_tokens": 12,
        "prompt_tokens": 900,
        "total_tokens": 912,
        "prompt_tokens_details": {"cached_tokens": 880},
    },
    "id": "chatcmpl-1",
    "timings": {
        "cache_n": 880,
        "prompt_n": 20,
        "prompt_ms": 51.5,
        "prompt_per_token_ms": 2.5,
        "prompt_per_second": 400.0,
        "predicted_n": 12,
        "predicted_ms": 120.25,
        "predicted_per_token_ms": 10.0,
        "predicted_per_second": 100.0,
    },
}

OPENAI_RESPONSE = {
    "id": "chatcmpl-2",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-5.1",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi"},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ],
    "usage": {
        "prompt_tokens": 2048,
        "completion_tokens": 300,
        "total_tokens": 2348,
        "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 256,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    },
}


def test_llama_response_measured_from_timings() -> None:
    raw = orjson.dumps(LLAMA_RESPONSE)
    m = CallMetrics()
    assert from_openai_compat_response(raw, m) is raw
    assert (m.prompt_tokens, m.cached_tokens, m.completion_tokens) == (900, 880, 12)
    assert m.evaluated_tokens == 20
    assert (m.prefill_ms, m.decode_ms) == (51.5, 120.25)
    assert m.reasoning_tokens is None  # llama.cpp does not split it out
    assert m.finish_reason == "stop" and m.upstream_model == "qwen"


def test_openai_response_evaluated_is_prompt_minus_cached() -> None:
    m = CallMetrics()
    from_openai_compat_response(orjson.dumps(OPENAI_RESPONSE), m)
    assert (m.prompt_tokens, m.cached_tokens, m.reasoning_tokens) == (2048, 1920, 256)
    assert m.evaluated_tokens == 128
    assert m.prefill_ms is None


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"<html>502 Bad Gateway</html>", "not JSON"),
        (b'{"choices": []}', "no choices"),
        (b'{"id": "x"}', "no choices"),
        (b"[1, 2]", "no choices"),
    ],
)
def test_malformed_200(raw: bytes, words: str) -> None:
    with pytest.raises(MalformedResponse, match=words) as info:
        from_openai_compat_response(raw, CallMetrics())
    assert info.value.http_status == 502 and info.value.code == "malformed_response"


def test_llama_context_overflow_becomes_context_length_exceeded() -> None:
    raw = orjson.dumps(
        {
            "error": {
                "code": 400,
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 5000,
                "n_ctx": 4096,
                "message": "request (5000 tokens) exceeds the available context size "
                "(4096 tokens), try increasing it",
            }
        }
    )
    err = error_from_openai_compat(400, raw, ())
    assert isinstance(err, ContextLengthExceeded)
    body = err.to_body()["error"]
    assert body["code"] == "context_length_exceeded" and body["param"] == "messages"
    assert body["type"] == "invalid_request_error"
    assert body["message"].startswith("request (5000 tokens) exceeds")


def test_an_unlisted_overflow_wording_is_recognised_on_a_400_only() -> None:
    # the upstream's status reaches the fallback: the same words at 500 stay a 500
    raw = orjson.dumps(
        {"error": {"message": "prompt token count of 9000 exceeds the limit of 8192"}}
    )
    assert isinstance(error_from_openai_compat(400, raw, ()), ContextLengthExceeded)
    other = error_from_openai_compat(500, raw, ())
    assert not isinstance(other, ContextLengthExceeded) and other.http_status == 500


def test_openai_error_keeps_status_type_code_and_hides_the_key() -> None:
    raw = orjson.dumps(
        {
            "error": {
                "message": "Incorrect API key provided: sk-secret-123. "
                "You can find your API key at https://platform.openai.com/account/api-keys.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        }
    )
    err = error_from_openai_compat(401, raw, ("sk-secret-123",))
    assert isinstance(err, UpstreamFailure)
    assert err.http_status == 401 and err.code == "invalid_api_key"
    assert "sk-secret-123" not in err.message and "***" in err.message


def test_llama_500_keeps_its_message() -> None:
    raw = orjson.dumps(
        {
            "error": {
                "code": 500,
                "type": "server_error",
                "message": "Failed to parse tool call arguments as JSON: x",
            }
        }
    )
    err = error_from_openai_compat(500, raw, ())
    assert err.http_status == 500 and err.type == "server_error" and err.code is None
    assert err.message.startswith("Failed to parse tool call arguments as JSON")


def test_llama_loading_503_is_upstream_unavailable() -> None:
    raw = b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'
    err = error_from_openai_compat(503, raw, ())
    assert err.http_status == 503 and err.code == "upstream_unavailable"


def test_non_json_error_body_is_quoted() -> None:
    err = error_from_openai_compat(502, b"Bad Gateway", ())
    assert err.http_status == 502 and err.message == "Bad Gateway"
    assert err.type == "upstream_error"


def test_vllm_top_level_error_body() -> None:
    raw = orjson.dumps(
        {
            "object": "error",
            "message": "This model's maximum context length is 16384 tokens. However, you "
            "requested 19591 tokens (9591 in the messages, 10000 in the completion).",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    )
    err = error_from_openai_compat(400, raw, ())
    assert isinstance(err, ContextLengthExceeded)
    assert "16384" in err.message
