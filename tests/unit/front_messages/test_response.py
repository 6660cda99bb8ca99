"""Golden cases: chat completions in, Messages API answers out (fronts/messages/response.py),
each read back with the official SDK's ``Message`` type."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from anthropic.types import Message

from boundedcode_gateway.fronts.messages.response import (
    answer_body,
    message_id,
    thinking_signature,
    to_message,
)
from boundedcode_gateway.fronts.messages.signature import signed_text
from boundedcode_gateway.fronts.sealing import Sealer

SEALER = Sealer(b"\x07" * 32, clock=lambda: 1_800_000_000.0)


def completion(message: dict[str, Any], finish: str = "stop", **usage: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-abc123",
        "object": "chat.completion",
        "created": 1,
        "model": "fake-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "total_tokens": 150,
            "prompt_tokens_details": {"cached_tokens": 100},
            **usage,
        },
    }


def messages_answer(chat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(answer_body(orjson.dumps(chat), "local", SEALER.sign))
    Message.model_validate(out, strict=False)  # the SDK reads it
    return out


def test_reasoning_text_and_tool_calls_become_signed_thinking_text_and_tool_use() -> None:
    chat = completion(
        {
            "role": "assistant",
            "content": "Let me look.",
            "reasoning_content": "The user wants files.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "ls", "arguments": '{"path": "."}'},
                },
                {"id": "call_2", "type": "function", "function": {"name": "pwd", "arguments": ""}},
            ],
        },
        "tool_calls",
    )
    assert messages_answer(chat) == {
        "id": "msg_abc123",
        "type": "message",
        "role": "assistant",
        "model": "fake-model",
        "content": [
            {
                "type": "thinking",
                "thinking": "The user wants files.",
                "signature": thinking_signature("local", "The user wants files.", SEALER.sign),
            },
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "call_1", "name": "ls", "input": {"path": "."}},
            {"type": "tool_use", "id": "call_2", "name": "pwd", "input": {}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 20,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 100,
            "output_tokens": 30,
        },
    }
    signature = messages_answer(chat)["content"][0]["signature"]
    assert SEALER.verify(signed_text("local", "The user wants files."), signature)
    assert not SEALER.verify(signed_text("other", "The user wants files."), signature)


@pytest.mark.parametrize(
    ("finish", "stop"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("content_filter", "refusal"),
        (None, "end_turn"),
    ],
)
def test_stop_reasons(finish: str | None, stop: str) -> None:
    chat = completion({"role": "assistant", "content": "x"}, finish)  # type: ignore[arg-type]
    assert messages_answer(chat)["stop_reason"] == stop


def test_an_empty_answer_has_no_blocks_and_unknown_usage_is_zero() -> None:
    chat = completion({"role": "assistant", "content": "", "reasoning_content": ""})
    del chat["usage"]
    out = messages_answer(chat)
    assert out["content"] == []
    assert out["usage"] == {
        "input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
    }


def test_a_refusal_is_text_with_its_stop_reason() -> None:
    chat = completion({"role": "assistant", "content": None, "refusal": "I can't help."})
    out = messages_answer(chat)
    assert out["content"] == [{"type": "text", "text": "I can't help."}]
    assert out["stop_reason"] == "refusal"


def test_arguments_that_are_not_an_object_become_an_empty_input() -> None:
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "[1]"}},
        {"id": "c2", "type": "function", "function": {"name": "b", "arguments": "{oops"}},
    ]
    out = to_message(
        completion({"role": "assistant", "content": None, "tool_calls": calls}),
        "local",
        SEALER.sign,
    )
    assert [b["input"] for b in out["content"]] == [{}, {}]


def test_message_ids() -> None:
    assert message_id("chatcmpl-xyz") == "msg_xyz"
    assert message_id("abc") == "msg_abc"
    assert message_id(None).startswith("msg_") and len(message_id(None)) == 28
