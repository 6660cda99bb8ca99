"""Golden cases: OpenAI chat-completions bodies in, Anthropic Messages bodies out.

The expected shapes follow Anthropic's Messages API reference (content blocks,
tool_use / tool_result, tool_choice, thinking, output_config, cache_control).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, get_type_hints

import pytest
from anthropic.types.message_create_params import MessageCreateParams, MessageCreateParamsBase
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from boundedcode_gateway.config import ThinkingSettings
from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.policy.structured import RequestedSchema
from boundedcode_gateway.providers.anthropic.request import (
    AnthropicTarget,
    ThinkingBlocks,
    to_anthropic_request,
)
from boundedcode_gateway.reasoning_store.keys import keys_for

TARGET = AnthropicTarget("claude-sonnet-4-5", max_tokens=4096)
THINKING = AnthropicTarget(
    "claude-sonnet-4-5", max_tokens=8192, thinking=ThinkingSettings(budget_tokens=2048)
)
# the version that still takes sampling parameters
OLD_TARGET = AnthropicTarget("claude-sonnet-4-5", max_tokens=4096, api_version="2023-06-01")
OLD_THINKING = AnthropicTarget(
    "claude-sonnet-4-5",
    max_tokens=8192,
    thinking=ThinkingSettings(budget_tokens=2048),
    api_version="2023-06-01",
)
_PARAMS = TypeAdapter(MessageCreateParams)
_SAMPLING = frozenset({"temperature", "top_p", "top_k"})
# the SDK's top-level keys, less the sampling ones (its 2.x types have none, 0.x ones do)
_SDK_KEYS = (frozenset(get_type_hints(MessageCreateParamsBase)) | {"stream"}) - _SAMPLING


def translate(body: dict[str, Any], target: AnthropicTarget = TARGET, **kw: Any) -> dict[str, Any]:
    out = to_anthropic_request(body, target, stream=False, **kw).body
    # the official SDK's request type accepts it, and every key is one the version takes
    _PARAMS.validate_python({k: v for k, v in out.items() if k not in _SAMPLING})
    assert set(out) <= _SDK_KEYS | (_SAMPLING if target.api_version == "2023-06-01" else set())
    return out


def _strip_cache(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip_cache(v) for k, v in obj.items() if k != "cache_control"}
    if isinstance(obj, list):
        return [_strip_cache(v) for v in obj]
    return obj


def test_system_and_developer_messages_become_the_system_prompt() -> None:
    out = translate(
        {
            "model": "claude",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
                {"role": "user", "content": "hi"},
            ],
        }
    )
    assert out["system"] == [
        {"type": "text", "text": "Be brief.\n\nUse tools.", "cache_control": {"type": "ephemeral"}}
    ]
    assert _strip_cache(out["messages"]) == [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    ]
    assert out["max_tokens"] == 4096  # the profile's default
    assert out["model"] == "claude-sonnet-4-5"


def test_images_data_urls_and_http_urls() -> None:
    out = translate(
        {
            "model": "claude",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this"},
                        {
                            "type": "image_url",
                            "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="},
                        },
                        {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
                    ],
                }
            ],
        }
    )
    blocks = _strip_cache(out["messages"][0]["content"])
    assert blocks[1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    assert blocks[2] == {
        "type": "image",
        "source": {"type": "url", "url": "https://example.com/a.jpg"},
    }


def test_tool_loop_history() -> None:
    out = translate(
        {
            "model": "claude",
            "messages": [
                {"role": "user", "content": "list files"},
                {
                    "role": "assistant",
                    "content": "Looking.",
                    "tool_calls": [
                        {
                            "id": "toolu_1",
                            "type": "function",
                            "function": {"name": "ls", "arguments": '{"path": "."}'},
                        },
                        {
                            "id": "toolu_2",
                            "type": "function",
                            "function": {"name": "pwd", "arguments": ""},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "toolu_1", "content": "a.py"},
                {"role": "tool", "tool_call_id": "toolu_2", "content": "/src"},
                {"role": "user", "content": "and now?"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "ls",
                        "description": "List a folder",
                        "parameters": {
                            "type": "object",
                            "properties": {"path": {"type": "string"}},
                        },
                    },
                },
                {"type": "function", "function": {"name": "pwd"}},
            ],
        }
    )
    assert _strip_cache(out["messages"]) == [
        {"role": "user", "content": [{"type": "text", "text": "list files"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "."}},
                {"type": "tool_use", "id": "toolu_2", "name": "pwd", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "/src"},
                {"type": "text", "text": "and now?"},
            ],
        },
    ]
    assert _strip_cache(out["tools"]) == [
        {
            "name": "ls",
            "description": "List a folder",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
        {"name": "pwd", "input_schema": {"type": "object", "properties": {}}},
    ]


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("auto", None, {"type": "auto"}),
        ("none", None, {"type": "none"}),
        ("required", None, {"type": "any"}),
        ({"type": "function", "function": {"name": "ls"}}, None, {"type": "tool", "name": "ls"}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        (None, None, None),
    ],
)
def test_tool_choice(choice: Any, parallel: bool | None, expected: dict[str, Any] | None) -> None:
    body: dict[str, Any] = {
        "model": "claude",
        "messages": [{"role": "user", "content": "go"}],
        "tools": [
            {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}
        ],
    }
    if choice is not None:
        body["tool_choice"] = choice
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    assert translate(body).get("tool_choice") == expected


def test_forced_tool_is_relaxed_to_auto_while_thinking() -> None:
    body = {
        "model": "claude",
        "messages": [{"role": "user", "content": "go"}],
        "tools": [{"type": "function", "function": {"name": "ls"}}],
        "tool_choice": {"type": "function", "function": {"name": "ls"}},
    }
    result = to_anthropic_request(body, THINKING, stream=False)
    assert result.body["tool_choice"] == {"type": "auto"}
    assert result.adjustments["tool_choice"] == "tool→auto"


def test_sampling_and_limits() -> None:
    out = translate(
        {
            "model": "claude",
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 1.7,
            "top_p": 0.9,
            "top_k": 40,
            "stop": "END",
            "max_completion_tokens": 300,
            "max_tokens": 999,
            "user": "u-1",
            "presence_penalty": 0.5,
            "seed": 3,
            "logprobs": True,
        },
        OLD_TARGET,
    )
    # by hand: the SDK's 2.x request types no longer list the sampling parameters
    assert out["temperature"] == 1.0  # Anthropic's range ends at 1
    assert out["top_p"] == 0.9
    assert out["top_k"] == 40
    assert out["stop_sequences"] == ["END"]
    assert out["max_tokens"] == 300  # max_completion_tokens wins
    assert out["metadata"] == {"user_id": "u-1"}
    for dropped in ("presence_penalty", "seed", "logprobs", "user"):
        assert dropped not in out


def test_thinking_from_profile_and_from_reasoning_effort() -> None:
    base = {"model": "claude", "messages": [{"role": "user", "content": "hi"}]}
    assert translate(base, THINKING)["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert "thinking" not in translate(base)  # the profile does not think
    effort = translate({**base, "reasoning_effort": "high"})
    assert effort["thinking"] == {"type": "enabled", "budget_tokens": 4095}  # below max_tokens
    assert "thinking" not in translate({**base, "reasoning_effort": "none"}, THINKING)
    adaptive = AnthropicTarget(
        "claude-opus-4-6", thinking=ThinkingSettings(mode="adaptive", level="medium")
    )
    out = translate({**base, "reasoning_effort": "xhigh"}, adaptive)
    assert out["thinking"] == {"type": "adaptive"}
    assert out["output_config"] == {"effort": "xhigh"}
    assert translate(base, adaptive)["output_config"] == {"effort": "medium"}


def test_thinking_turns_off_when_max_tokens_leaves_no_room() -> None:
    body = {"model": "claude", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 500}
    result = to_anthropic_request(body, THINKING, stream=False)
    assert "thinking" not in result.body
    assert "thinking" in result.adjustments


def test_temperature_is_dropped_while_thinking() -> None:
    body = {"model": "claude", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2}
    result = to_anthropic_request(body, OLD_THINKING, stream=False)
    assert "temperature" not in result.body
    assert result.adjustments == {"sampling_dropped": ["temperature"]}


def test_schema_goes_to_output_config_format_with_objects_closed() -> None:
    schema = RequestedSchema(
        "answer",
        {
            "type": "object",
            "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}},
        },
    )
    out = translate(
        {"model": "claude", "messages": [{"role": "user", "content": "json"}]}, schema=schema
    )
    assert out["output_config"] == {
        "format": {
            "type": "json_schema",
            "schema": {
                "type": "object",
                "properties": {
                    "a": {
                        "type": "object",
                        "properties": {"b": {"type": "integer"}},
                        "additionalProperties": False,
                    }
                },
                "additionalProperties": False,
            },
        }
    }


def test_stored_thinking_goes_back_verbatim_and_caller_reasoning_never_does() -> None:
    thinking = {"type": "thinking", "thinking": "I should list.", "signature": "sig+/=="}
    redacted = {"type": "redacted_thinking", "data": "opaque=="}
    stored: dict[str, ThinkingBlocks] = {"tool:toolu_1": [(0, thinking), (1, redacted)]}

    def lookup(keys: Sequence[str]) -> ThinkingBlocks | None:
        return next((stored[k] for k in keys if k in stored), None)

    body = {
        "model": "claude",
        "messages": [
            {"role": "user", "content": "list"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "a caller's copy that must not be sent",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "ls", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "a.py"},
            {"role": "assistant", "content": "Done.", "reasoning_content": "other"},
            {"role": "user", "content": "thanks"},
        ],
    }
    result = to_anthropic_request(body, THINKING, stream=False, lookup=lookup)
    turns = result.body["messages"]
    assert turns[1]["content"][:2] == [thinking, redacted]
    assert turns[1]["content"][2]["type"] == "tool_use"
    assert turns[3] == {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}
    assert "caller's copy" not in str(result.body) and "other" not in str(result.body)
    assert result.adjustments["thinking_blocks_replayed"] == 1


def test_text_turns_are_found_by_their_text_and_the_message_they_answered() -> None:
    block = {"type": "thinking", "thinking": "", "signature": "s"}
    key = keys_for([], "Paris.", "capital of France?")[0]

    def lookup(keys: Sequence[str]) -> ThinkingBlocks | None:
        return [(0, block)] if key in keys else None

    body = {
        "model": "claude",
        "messages": [
            {"role": "user", "content": "capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "and Italy?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "sure?"},
        ],
    }
    turns = translate(body, THINKING, lookup=lookup)["messages"]
    assert turns[1]["content"][0] == block
    assert turns[3]["content"][0]["type"] == "text"  # same text, other question: not that turn


def test_cache_breakpoints_on_tools_system_last_turn_and_the_user_turn_before() -> None:
    body = {
        "model": "claude",
        "messages": [
            {"role": "system", "content": "rules"},
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": "three"},
            {"role": "assistant", "content": "four"},
            {"role": "user", "content": "five"},
        ],
        "tools": [{"type": "function", "function": {"name": "ls"}}],
    }
    out = translate(body)
    marks = [
        (t["role"], b.get("text"))
        for t in out["messages"]
        for b in t["content"]
        if "cache_control" in b
    ]
    assert marks == [("user", "three"), ("user", "five")]
    assert "cache_control" in out["tools"][-1] and "cache_control" in out["system"][-1]


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        translate(
            {
                "model": "claude",
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "t",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{oops"},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "t", "content": "r"},
                ],
            }
        )
    with pytest.raises(InvalidRequest, match="n must be 1"):
        translate({"model": "claude", "messages": [{"role": "user", "content": "x"}], "n": 2})
    with pytest.raises(InvalidRequest, match="input_audio"):
        translate(
            {
                "model": "claude",
                "messages": [
                    {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}
                ],
            }
        )


# --------------------------------------------------------------------------- API versions

_HI = [{"role": "user", "content": "hi"}]


def test_the_newest_version_is_the_default_and_drops_sampling_with_a_note() -> None:
    assert TARGET.api_version == "2026-10-21"
    body = {"model": "c", "messages": _HI, "temperature": 0, "top_p": 1, "top_k": 5, "stop": "X"}
    result = to_anthropic_request(body, TARGET, stream=False)
    assert _SAMPLING.isdisjoint(result.body)
    assert result.body["stop_sequences"] == ["X"]
    assert result.adjustments == {
        "dropped_for_api_version": {
            "version": "2026-10-21",
            "fields": ["temperature", "top_p", "top_k"],
        }
    }
    translate(body)


def test_only_what_the_caller_sent_is_named_and_nothing_is_noted_without_it() -> None:
    one = to_anthropic_request({"model": "c", "messages": _HI, "top_p": 0.5}, TARGET, stream=False)
    assert one.adjustments == {
        "dropped_for_api_version": {"version": "2026-10-21", "fields": ["top_p"]}
    }
    none = to_anthropic_request({"model": "c", "messages": _HI}, TARGET, stream=False)
    assert none.adjustments == {}


def test_the_version_is_the_reason_given_while_thinking_too() -> None:
    body = {"model": "c", "messages": _HI, "temperature": 0.2}
    result = to_anthropic_request(body, THINKING, stream=False)
    assert result.adjustments["dropped_for_api_version"]["fields"] == ["temperature"]
    assert "sampling_dropped" not in result.adjustments


def test_2023_06_01_sends_sampling_as_before_and_drops_it_for_a_refusing_model() -> None:
    body = {"model": "c", "messages": _HI, "temperature": 0.2, "top_p": 0.9, "top_k": 3}
    sent = to_anthropic_request(body, OLD_TARGET, stream=False)
    assert (sent.body["temperature"], sent.body["top_p"], sent.body["top_k"]) == (0.2, 0.9, 3)
    assert sent.adjustments == {}
    refused = to_anthropic_request(body, OLD_TARGET, stream=False, sampling=False)
    assert _SAMPLING.isdisjoint(refused.body)
    assert refused.adjustments == {"sampling_dropped": ["temperature", "top_p", "top_k"]}


def test_a_top_k_anthropic_cannot_take_is_a_clear_error_where_it_is_sent() -> None:
    for bad in ("40", 1.5, -1, True):
        body = {"model": "c", "messages": _HI, "top_k": bad}
        with pytest.raises(InvalidRequest, match="top_k"):
            to_anthropic_request(body, OLD_TARGET, stream=False)
        # the newest version sends no top_k at all, so there is nothing to refuse
        assert "top_k" not in to_anthropic_request(body, TARGET, stream=False).body


_SAMPLING_VALUES = st.one_of(st.none(), st.floats(0, 2), st.integers(0, 500))


@given(
    temperature=_SAMPLING_VALUES,
    top_p=_SAMPLING_VALUES,
    top_k=st.one_of(st.none(), st.integers(0, 500)),
    thinking=st.booleans(),
)
def test_the_newest_version_never_sends_what_it_removed_and_names_all_of_it(
    temperature: float | None, top_p: float | None, top_k: int | None, thinking: bool
) -> None:
    sent = {"temperature": temperature, "top_p": top_p, "top_k": top_k}
    body = {"model": "c", "messages": _HI, **{k: v for k, v in sent.items() if v is not None}}
    result = to_anthropic_request(body, THINKING if thinking else TARGET, stream=False)
    assert _SAMPLING.isdisjoint(result.body)
    named = result.adjustments.get("dropped_for_api_version", {}).get("fields", [])
    assert named == [k for k, v in sent.items() if v is not None]
