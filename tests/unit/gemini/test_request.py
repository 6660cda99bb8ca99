"""Golden tests: the caller's OpenAI request as Gemini's ``generateContent`` body."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from boundedcode_gateway.config import ThinkingSettings
from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.policy.structured import requested_schema
from boundedcode_gateway.providers.gemini.request import (
    gemini_url,
    to_gemini_request,
    to_thinking_config,
)
from boundedcode_gateway.providers.gemini.signatures import PLACEHOLDER, TurnSignatures
from boundedcode_gateway.reasoning_store.keys import message_keys

PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEA"
    + "wS2OUAAAAABJRU5ErkJggg=="
)


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


HISTORY: list[Any] = [
    {"role": "system", "content": "You are terse."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ],
    },
    {
        "role": "assistant",
        "content": "Let me look.",
        "reasoning_content": "the caller's copy, never sent",
        "tool_calls": [call("c1", "zoom", '{"x": 1}'), call("c2", "crop", "")],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "zoomed"},
    {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "cropped"}]},
]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "zoom",
            "description": "Zoom in.",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
        },
    },
    {"type": "function", "function": {"name": "crop"}},
]


def test_golden_request() -> None:
    body = {
        "model": "g",
        "messages": HISTORY,
        "tools": TOOLS,
        "tool_choice": "auto",
        "temperature": 0,
        "max_tokens": 100,
        "stop": "STOP",
        "parallel_tool_calls": True,
        "seed": 3,
    }
    out = to_gemini_request(body, model="gemini-3-pro-preview", thinking=None)
    assert out.body == {
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": "What is in this picture?"},
                    {"inlineData": {"mimeType": "image/png", "data": PNG}},
                ],
            },
            {
                "role": "model",
                "parts": [
                    {"text": "Let me look."},
                    {
                        "functionCall": {"name": "zoom", "args": {"x": 1}},
                        "thoughtSignature": PLACEHOLDER,
                    },
                    {"functionCall": {"name": "crop", "args": {}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "zoom", "response": {"output": "zoomed"}}},
                    {"functionResponse": {"name": "crop", "response": {"output": "cropped"}}},
                ],
            },
        ],
        "systemInstruction": {"parts": [{"text": "You are terse."}]},
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "zoom",
                        "description": "Zoom in.",
                        "parametersJsonSchema": TOOLS[0]["function"]["parameters"],
                    },
                    {"name": "crop"},
                ]
            }
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
        "generationConfig": {
            "temperature": 0,
            "maxOutputTokens": 100,
            "stopSequences": ["STOP"],
            "thinkingConfig": {"includeThoughts": True},
        },
    }
    assert out.placeholders == 1


@pytest.mark.parametrize(
    ("choice", "config"),
    [
        ("none", {"mode": "NONE"}),
        ("required", {"mode": "ANY"}),
        (
            {"type": "function", "function": {"name": "zoom"}},
            {"mode": "ANY", "allowedFunctionNames": ["zoom"]},
        ),
    ],
)
def test_tool_choice(choice: Any, config: dict[str, Any]) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS, "tool_choice": choice}
    out = to_gemini_request(body, model="gemini-3-flash", thinking=None).body
    assert out["toolConfig"] == {"functionCallingConfig": config}


def test_no_tools_no_tool_config() -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}
    out = to_gemini_request(body, model="gemini-3-flash", thinking=None).body
    assert "tools" not in out and "toolConfig" not in out


def test_url() -> None:
    base = "https://generativelanguage.googleapis.com/v1beta/"
    assert gemini_url(base, "gemini-3-pro-preview", False) == (
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-3-pro-preview:generateContent"
    )
    assert gemini_url(base, "gemini-2.5-flash", True).endswith(
        "/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    )


@pytest.mark.parametrize(
    ("settings", "effort", "model", "config"),
    [
        (None, None, "gemini-3-pro-preview", {"includeThoughts": True}),
        (None, "high", "gemini-3-pro-preview", {"thinkingLevel": "high", "includeThoughts": True}),
        (None, "xhigh", "gemini-3-pro-preview", {"thinkingLevel": "high", "includeThoughts": True}),
        (None, "none", "gemini-3-flash", {"thinkingLevel": "minimal"}),
        (None, "medium", "gemini-2.5-pro", {"thinkingBudget": 8192, "includeThoughts": True}),
        (None, "none", "gemini-2.5-flash", {"thinkingBudget": 0}),
        (ThinkingSettings(mode="off"), None, "gemini-2.5-flash", {"thinkingBudget": 0}),
        (ThinkingSettings(mode="off"), None, "gemini-3-pro-preview", None),
        (
            ThinkingSettings(mode="off"),
            "low",
            "gemini-3-pro-preview",
            {"thinkingLevel": "low", "includeThoughts": True},
        ),
        (
            ThinkingSettings(level="minimal"),
            None,
            "gemini-3-flash",
            {"includeThoughts": True, "thinkingLevel": "minimal"},
        ),
        (
            ThinkingSettings(level="high"),
            None,
            "gemini-2.5-flash",
            {"includeThoughts": True, "thinkingBudget": 24576},
        ),
        (
            ThinkingSettings(budget_tokens=2048),
            None,
            "gemini-3-pro-preview",
            {"includeThoughts": True, "thinkingBudget": 2048},
        ),
        (
            ThinkingSettings(mode="adaptive"),
            None,
            "gemini-2.5-pro",
            {"includeThoughts": True, "thinkingBudget": -1},
        ),
        (
            ThinkingSettings(mode="adaptive"),
            None,
            "gemini-3-pro-preview",
            {"includeThoughts": True},
        ),
    ],
)
def test_thinking_table(
    settings: ThinkingSettings | None, effort: str | None, model: str, config: Any
) -> None:
    out = to_thinking_config(settings, effort, model)
    assert out == config
    assert out is None or not ("thinkingLevel" in out and "thinkingBudget" in out)


def test_profile_max_tokens_is_the_default_limit() -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "x"}]}
    out = to_gemini_request(body, model="gemini-3-flash", thinking=None, default_max_tokens=77)
    assert out.body["generationConfig"]["maxOutputTokens"] == 77
    body["max_completion_tokens"] = 5
    out = to_gemini_request(body, model="gemini-3-flash", thinking=None, default_max_tokens=77)
    assert out.body["generationConfig"]["maxOutputTokens"] == 5


def test_schema_sent_or_left_out() -> None:
    schema = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "string"}}}
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    }
    requested = requested_schema(body)
    out = to_gemini_request(body, model="gemini-3-flash", thinking=None, schema=requested)
    config = out.body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"] is schema  # as the caller wrote it, field order kept
    without = to_gemini_request(
        body, model="gemini-3-flash", thinking=None, schema=requested, send_schema=False
    )
    assert "responseJsonSchema" not in without.body["generationConfig"]
    assert "responseMimeType" not in without.body["generationConfig"]


def test_json_object_asks_for_json() -> None:
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_object"},
    }
    config = to_gemini_request(body, model="gemini-3-flash", thinking=None).body["generationConfig"]
    assert config["responseMimeType"] == "application/json" and "responseJsonSchema" not in config


def test_stored_signatures_go_back_on_their_parts() -> None:
    messages: list[Any] = [
        {"role": "user", "content": "Go"},
        {
            "role": "assistant",
            "content": "Sure.",
            "tool_calls": [call("g1", "a", "{}"), call("g2", "b", "{}")],
        },
        {"role": "tool", "tool_call_id": "g1", "content": "1"},
        {"role": "tool", "tool_call_id": "g2", "content": "2"},
        {"role": "assistant", "content": "Both done."},
        {"role": "user", "content": "Thanks"},
    ]
    stored = {
        tuple(message_keys(messages, 1)): TurnSignatures({1: "SIG_B", 0: "SIG_A"}, native_ids=True),
        tuple(message_keys(messages, 4)): TurnSignatures({-1: "SIG_TEXT"}),
    }

    def lookup(keys: Sequence[str]) -> TurnSignatures | None:
        return stored.get(tuple(keys))

    out = to_gemini_request(
        {"messages": messages}, model="gemini-3-flash", thinking=None, lookup=lookup
    )
    model_turn, answers, text_turn = out.body["contents"][1:4]
    assert model_turn["parts"] == [
        {"text": "Sure."},
        {"functionCall": {"name": "a", "args": {}, "id": "g1"}, "thoughtSignature": "SIG_A"},
        {"functionCall": {"name": "b", "args": {}, "id": "g2"}, "thoughtSignature": "SIG_B"},
    ]
    # Gemini's own ids go back on the results too
    assert [p["functionResponse"]["id"] for p in answers["parts"]] == ["g1", "g2"]
    assert text_turn == {
        "role": "model",
        "parts": [{"text": "Both done.", "thoughtSignature": "SIG_TEXT"}],
    }
    assert out.placeholders == 0


def test_placeholders_only_in_the_current_turn() -> None:
    messages: list[Any] = [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": None, "tool_calls": [call("o1", "a", "{}")]},
        {"role": "tool", "tool_call_id": "o1", "content": "1"},
        {"role": "user", "content": "Again"},
        {"role": "assistant", "content": None, "tool_calls": [call("o2", "a", "{}")]},
        {"role": "tool", "tool_call_id": "o2", "content": "2"},
        {"role": "assistant", "content": None, "tool_calls": [call("o3", "a", "{}")]},
        {"role": "tool", "tool_call_id": "o3", "content": "3"},
    ]
    out = to_gemini_request({"messages": messages}, model="gemini-3-flash", thinking=None)
    signed = [
        "thoughtSignature" in c["parts"][0] for c in out.body["contents"] if c["role"] == "model"
    ]
    assert signed == [False, True, True]
    assert out.placeholders == 2
    # results and the next user message share one user content: a new turn
    assert out.body["contents"][2]["parts"][1] == {"text": "Again"}


def test_empty_assistant_turn_is_left_out() -> None:
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "b"},
    ]
    out = to_gemini_request({"messages": messages}, model="gemini-3-flash", thinking=None)
    assert out.body["contents"] == [{"role": "user", "parts": [{"text": "a"}, {"text": "b"}]}]


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ({"role": "tool", "tool_call_id": "nope", "content": "x"}, "answers no tool call"),
        (
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}],
            },
            "data: URLs",
        ),
        ({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}, "input_audio"),
        (
            {"role": "assistant", "content": None, "tool_calls": [call("c", "f", "[1]")]},
            "JSON object",
        ),
    ],
)
def test_bad_input_is_a_400(message: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        to_gemini_request({"messages": [message]}, model="gemini-3-flash", thinking=None)
