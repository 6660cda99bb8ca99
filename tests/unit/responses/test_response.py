"""A chat completion as a ``Response``: its items, status, usage and echo, as the SDK's
types read them."""

from __future__ import annotations

import itertools
from typing import Any

from boundedcode_gateway.fronts.responses.response import (
    Echo,
    Frame,
    from_chat_completion,
    from_chat_usage,
)
from boundedcode_gateway.fronts.responses.sealed import open_reasoning
from boundedcode_gateway.fronts.sealing import Sealer
from boundedcode_gateway.wire.chat import Stamps
from tests.responses_sdk import check_response

SEALER = Sealer(b"\x07" * 32, clock=lambda: 1_800_000_000.0)


def stamps() -> Stamps:
    counter = itertools.count(1)
    return Stamps(clock=lambda: 1_700_000_000.5, random_hex=lambda: f"{next(counter):04x}")


def completion(message: dict[str, Any], finish: str = "stop", **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "local",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
        ],
        **extra,
    }


USAGE = {
    "prompt_tokens": 120,
    "completion_tokens": 30,
    "total_tokens": 150,
    "prompt_tokens_details": {"cached_tokens": 100},
    "completion_tokens_details": {"reasoning_tokens": 12},
}


def answer(chat: dict[str, Any], echo: Echo | None = None) -> dict[str, Any]:
    s = stamps()
    frame = Frame.new(echo or Echo(model="local"), s)
    out = from_chat_completion(chat, frame, SEALER, s)
    check_response(out)
    return out


def test_reasoning_text_and_tool_calls() -> None:
    out = answer(
        completion(
            {
                "content": "Reading both.",
                "reasoning_content": "Both files matter.",
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "read", "arguments": '{"p":"a"}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "read", "arguments": "{}"},
                    },
                ],
            },
            "tool_calls",
            usage=USAGE,
        )
    )
    reasoning = out["output"][0]
    assert (
        open_reasoning(SEALER, "local", reasoning.pop("encrypted_content")) == "Both files matter."
    )
    assert out == {
        "id": "resp_0001",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "completed_at": 1_700_000_000,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": "local",
        "output": [
            {
                "id": "rs_0002",
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "Both files matter."}],
                "status": "completed",
            },
            {
                "id": "msg_0003",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {
                        "type": "output_text",
                        "text": "Reading both.",
                        "annotations": [],
                        "logprobs": [],
                    }
                ],
            },
            {
                "id": "fc_0004",
                "type": "function_call",
                "call_id": "call_a",
                "name": "read",
                "arguments": '{"p":"a"}',
                "status": "completed",
            },
            {
                "id": "fc_0005",
                "type": "function_call",
                "call_id": "call_b",
                "name": "read",
                "arguments": "{}",
                "status": "completed",
            },
        ],
        "parallel_tool_calls": True,
        "reasoning": None,
        "temperature": None,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "truncation": "disabled",
        "usage": {
            "input_tokens": 120,
            "input_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 0},
            "output_tokens": 30,
            "output_tokens_details": {"reasoning_tokens": 12},
            "total_tokens": 150,
        },
        "user": None,
        "metadata": {},
    }


def test_a_cut_answer_is_incomplete() -> None:
    out = answer(completion({"content": "Half an ans"}, "length"))
    assert out["status"] == "incomplete"
    assert out["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [i["status"] for i in out["output"]] == ["incomplete"]
    assert out["usage"] is None


def test_an_empty_answer_has_no_items() -> None:
    assert answer(completion({"content": ""}))["output"] == []
    assert answer(completion({"content": None, "reasoning_content": ""}))["output"] == []


def test_the_echo_is_repeated() -> None:
    echo = Echo(
        model="local",
        instructions="Be brief.",
        tools=[
            {"type": "function", "name": "f", "description": None, "parameters": {}, "strict": None}
        ],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0.5,
        top_p=1.0,
        max_output_tokens=50,
        reasoning={"effort": "low", "summary": None},
        metadata={"a": "b"},
        user="u",
    )
    out = answer(completion({"content": "ok"}), echo)
    assert out["instructions"] == "Be brief."
    assert out["tools"][0]["name"] == "f"
    assert (out["tool_choice"], out["parallel_tool_calls"], out["temperature"]) == (
        "required",
        False,
        0.5,
    )
    assert (out["max_output_tokens"], out["user"], out["metadata"]) == (50, "u", {"a": "b"})
    assert out["reasoning"] == {"effort": "low", "summary": None}


def test_usage_without_details() -> None:
    assert from_chat_usage({"prompt_tokens": 5, "completion_tokens": 2}) == {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 7,
    }
    assert from_chat_usage(None) is None
