"""A Responses request as the chat body: every item kind, the assistant's items gathered
into the turns they came from, reasoning back only from the gateway's own seal, and
each refusal naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.fronts.responses.request import to_chat_request
from boundedcode_gateway.fronts.responses.response import Echo
from boundedcode_gateway.fronts.responses.sealed import open_reasoning, seal_reasoning
from boundedcode_gateway.fronts.sealing import Sealer
from boundedcode_gateway.ingress.validate import check_chat_body

SEALER = Sealer(b"\x07" * 32, clock=lambda: 1_800_000_000.0)
OTHER_KEY = Sealer(b"\x08" * 32, clock=lambda: 1_800_000_000.0)


def chat(request: dict[str, Any]) -> dict[str, Any]:
    body, _ = to_chat_request({"model": "local", **request}, SEALER)
    # whatever the front builds is a body the chat path takes
    return check_chat_body(body)


def refused(request: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        to_chat_request({"model": "local", "input": "hi", **request}, SEALER)
    assert info.value.http_status == 400
    assert info.value.type == "invalid_request_error"
    return info.value


def test_a_string_input_with_instructions() -> None:
    body = chat({"input": "What is 2+2?", "instructions": "Be brief."})
    assert body == {
        "model": "local",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
        ],
    }


def test_a_tool_loop_becomes_the_chat_turns_it_came_from() -> None:
    sealed = seal_reasoning(SEALER, "local", "I should read both files.")
    foreign = seal_reasoning(OTHER_KEY, "local", "not ours")
    body = chat(
        {
            "input": [
                {
                    "type": "message",
                    "role": "developer",
                    "content": [{"type": "input_text", "text": "Rules."}],
                },
                {"role": "user", "content": "Read a and b."},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": sealed},
                {
                    "type": "function_call",
                    "call_id": "call_a",
                    "name": "read",
                    "arguments": '{"p":"a"}',
                },
                {
                    "type": "function_call",
                    "call_id": "call_b",
                    "name": "read",
                    "arguments": '{"p":"b"}',
                },
                {"type": "function_call_output", "call_id": "call_a", "output": "A"},
                {"type": "function_call_output", "call_id": "call_b", "output": "B"},
                {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": foreign},
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_1",
                    "status": "completed",
                    "content": [
                        {"type": "output_text", "text": "Both ", "annotations": []},
                        {"type": "output_text", "text": "read.", "annotations": []},
                    ],
                },
                {"role": "user", "content": [{"type": "input_text", "text": "Thanks."}]},
            ]
        }
    )
    assert body["messages"] == [
        {"role": "developer", "content": "Rules."},
        {"role": "user", "content": "Read a and b."},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I should read both files.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"p":"a"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"p":"b"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "A"},
        {"role": "tool", "tool_call_id": "call_b", "content": "B"},
        # a reasoning item the gateway did not seal is dropped
        {"role": "assistant", "content": "Both read."},
        {"role": "user", "content": "Thanks."},
    ]


def test_reasoning_sealed_for_another_profile_is_not_given_back() -> None:
    sealed = seal_reasoning(SEALER, "gpt", "written by another model")
    assert open_reasoning(SEALER, "local", sealed) is None
    body = chat(
        {
            "input": [
                {"role": "user", "content": "Hi"},
                {"type": "reasoning", "summary": [], "encrypted_content": sealed},
                {"role": "assistant", "content": "Hello"},
            ]
        }
    )
    assert body["messages"][1] == {"role": "assistant", "content": "Hello"}


def test_items_that_cannot_follow_each_other_start_a_new_turn() -> None:
    first = seal_reasoning(SEALER, "local", "first")
    second = seal_reasoning(SEALER, "local", "second")
    body = chat(
        {
            "input": [
                {"role": "user", "content": "Go"},
                {"role": "assistant", "content": "One."},
                {"role": "assistant", "content": "Two."},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "reasoning", "summary": [], "encrypted_content": first},
                {"role": "assistant", "content": "Three."},
                # reasoning whose answer was not sent back has no turn to go with
                {"type": "reasoning", "summary": [], "encrypted_content": second},
                {"role": "user", "content": "Next"},
            ]
        }
    )
    assert body["messages"][1:] == [
        {"role": "assistant", "content": "One."},
        {
            "role": "assistant",
            "content": "Two.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "assistant", "content": "Three.", "reasoning_content": "first"},
        {"role": "user", "content": "Next"},
    ]


def test_images_and_parts() -> None:
    body = chat(
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {
                            "type": "input_image",
                            "image_url": "data:image/png;base64,AAAA",
                            "detail": "low",
                        },
                    ],
                },
            ]
        }
    )
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
    ]
    error = refused(
        {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}
    )
    assert (error.param, error.code) == ("input[0].content[0].file_id", "unsupported_parameter")
    error = refused(
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}
    )
    assert error.param == "input[0].content[0].type" and "input_file" in error.message


def test_function_tools_choice_and_options() -> None:
    body, echo = to_chat_request(
        {
            "model": "local",
            "input": "hi",
            "tools": [
                {
                    "type": "function",
                    "name": "read",
                    "description": "Read a file",
                    "parameters": {"type": "object", "properties": {"p": {"type": "string"}}},
                    "strict": True,
                }
            ],
            "tool_choice": {"type": "function", "name": "read"},
            "parallel_tool_calls": False,
            "max_output_tokens": 300,
            "temperature": 0.2,
            "top_p": 0.9,
            "reasoning": {"effort": "high", "summary": "auto"},
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "out",
                    "schema": {"type": "object"},
                    "strict": True,
                },
                "verbosity": "low",
            },
            "stream": True,
            "user": "u1",
            "store": True,
            "include": ["reasoning.encrypted_content"],
            "metadata": {"k": "v"},
            "prompt_cache_key": "abc",
            "service_tier": "auto",
            "truncation": "disabled",
        },
        SEALER,
    )
    assert body == {
        "model": "local",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "read",
                    "description": "Read a file",
                    "parameters": {"type": "object", "properties": {"p": {"type": "string"}}},
                    "strict": True,
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "read"}},
        "parallel_tool_calls": False,
        "max_completion_tokens": 300,
        "temperature": 0.2,
        "top_p": 0.9,
        "reasoning_effort": "high",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
        },
        "verbosity": "low",
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "u1",
    }
    assert echo.tools[0]["name"] == "read" and echo.tools[0]["strict"] is True
    assert echo.tool_choice == {"type": "function", "name": "read"}
    assert (echo.parallel_tool_calls, echo.max_output_tokens, echo.user) == (False, 300, "u1")
    assert echo.reasoning == {"effort": "high", "summary": None}
    assert echo.metadata == {"k": "v"}
    json_object, _ = to_chat_request(
        {"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}, SEALER
    )
    assert json_object["response_format"] == {"type": "json_object"}


def noted(request: dict[str, Any]) -> tuple[dict[str, Any], Echo, dict[str, Any]]:
    notes: dict[str, Any] = {}
    body, echo = to_chat_request({"model": "local", **request}, SEALER, notes)
    return check_chat_body(body), echo, notes


def test_built_in_tools_are_dropped_and_noted() -> None:
    body, echo, notes = noted(
        {
            "input": "hi",
            "tools": [
                {"type": "function", "name": "f"},
                {"type": "web_search", "external_web_access": False},
                {"type": "mcp", "server_label": "x"},
                {"type": "code_interpreter", "container": {"type": "auto"}},
                {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
                {"type": "web_search"},
            ],
        }
    )
    assert body["tools"] == [{"type": "function", "function": {"name": "f"}}]
    assert notes == {"tools_dropped": ["web_search", "mcp", "code_interpreter", "custom"]}
    assert [t["name"] for t in echo.tools] == ["f"]


def test_only_built_in_tools_leave_no_tools() -> None:
    body, _, notes = noted(
        {"input": "hi", "tools": [{"type": "web_search"}], "tool_choice": "auto"}
    )
    assert "tools" not in body and "tool_choice" not in body
    assert notes == {"tools_dropped": ["web_search"]}
    error = refused({"tools": [{"type": "web_search"}], "tool_choice": "required"})
    assert (error.param, error.code) == ("tool_choice", "unsupported_value")
    assert "web_search" in error.message


@pytest.mark.parametrize(
    "choice",
    [
        {"type": "web_search"},
        {"type": "web_search_preview"},
        {"type": "file_search"},
        {"type": "mcp", "server_label": "x"},
        {"type": "custom", "name": "apply_patch"},
        {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "web_search"}]},
    ],
)
def test_a_tool_choice_that_needs_a_dropped_tool_is_refused_by_name(choice: Any) -> None:
    error = refused({"tools": [{"type": "web_search"}], "tool_choice": choice})
    assert (error.param, error.code) == ("tool_choice", "unsupported_value")
    assert error.message.startswith("Unsupported value: 'tool_choice' does not support '"), (
        error.message
    )


def test_an_unknown_tool_type_is_refused_in_openai_words() -> None:
    error = refused({"tools": [{"type": "telepathy"}]})
    assert (error.param, error.code) == ("tools[0].type", "invalid_value")
    assert error.message.startswith("Invalid value: 'telepathy'. Supported values are: 'function'")


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("previous_response_id", "resp_123", "keeps no responses"),
        ("conversation", "conv_1", "keeps no conversations"),
        ("prompt", {"id": "pmpt_1"}, "no stored prompts"),
        ("background", True, "at once"),
        ("top_logprobs", 3, "log probabilities"),
    ],
)
def test_what_the_gateway_cannot_honour_is_refused(field: str, value: Any, words: str) -> None:
    error = refused({field: value})
    assert error.param == field
    assert words in error.message


def test_previous_response_id_says_to_send_the_whole_input() -> None:
    error = refused({"previous_response_id": "resp_1"})
    # OpenAI's answer to an id it does not have
    assert error.code == "previous_response_not_found"
    assert error.message.startswith("Previous response with id 'resp_1' not found.")
    assert "send the whole conversation in 'input'" in error.message


@pytest.mark.parametrize(
    ("request_", "param"),
    [
        ({"frobnicate": 1}, "frobnicate"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"reasoning": {"effort": "low", "budget": 9}}, "reasoning.budget"),
        ({"reasoning": {"context": "all_turns"}}, "reasoning.context"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
        ({"text": {"shape": 1}}, "text.shape"),
        ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"max_output_tokens": "many"}, "max_output_tokens"),
        ({"instructions": ["x"]}, "instructions"),
        ({"input": None}, "input"),
        ({"input": 5}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].id"),
        ({"input": [{"type": "compaction", "encrypted_content": "x"}]}, "input[0].type"),
        ({"input": [{"type": "telepathy"}]}, "input[0].type"),
        ({"truncation": "sometimes"}, "truncation"),
        ({"text": {"verbosity": "loud"}}, "text.verbosity"),
        ({"top_logprobs": "3"}, "top_logprobs"),
        ({"input": [{"type": "message", "content": "x"}]}, "input[0].role"),
        ({"input": [{"type": "message", "role": "tool", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
        (
            {
                "input": [
                    {"role": "assistant", "content": [{"type": "input_image", "image_url": "u"}]}
                ]
            },
            "input[0].content[0].type",
        ),
    ],
)
def test_a_bad_field_is_named(request_: dict[str, Any], param: str) -> None:
    assert refused(request_).param == param


def test_inert_fields_are_taken_and_not_forwarded() -> None:
    body = chat(
        {
            "input": "x",
            "store": True,
            "background": False,
            "max_tool_calls": 3,
            "safety_identifier": "s",
            "prompt_cache_retention": "24h",
            "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
            "stream_options": {"include_obfuscation": False},
            "service_tier": "flex",
            "top_logprobs": 0,
            "background_options": {"completion_window": "soonest"},
            "truncation": "disabled",
            "include": ["reasoning.encrypted_content"],
        }
    )
    assert body == {"model": "local", "messages": [{"role": "user", "content": "x"}]}


def test_truncation_auto_and_context_management_are_taken() -> None:
    """Both change nothing while the conversation fits the model; beyond it the answer is
    context_length_exceeded, as it is without them."""
    body, echo, notes = noted(
        {
            "input": "x",
            "truncation": "auto",
            "context_management": [{"type": "compaction", "compact_threshold": 200000}],
        }
    )
    assert body == {"model": "local", "messages": [{"role": "user", "content": "x"}]}
    assert echo.truncation == "auto"
    assert notes == {"fields_ignored": ["context_management"]}


def test_a_body_without_a_model_is_left_to_the_chat_checks() -> None:
    body, echo = to_chat_request({"input": "x"}, SEALER)
    with pytest.raises(InvalidRequest, match="'model'"):
        check_chat_body(body)
    assert echo == Echo(model="")
    assert to_chat_request([1], SEALER)[0] == [1]


def test_a_request_as_codex_sends_it() -> None:
    """Codex's body with store false: every field it sends is taken."""
    sealed = seal_reasoning(SEALER, "local", "Look at the tree first.")
    body, _ = to_chat_request(
        {
            "model": "local",
            "instructions": "You are Codex.",
            "input": [
                {
                    "type": "message",
                    "role": "developer",
                    "content": [{"type": "input_text", "text": "<permissions/>"}],
                },
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "List the files."}],
                },
                {"type": "reasoning", "summary": [], "content": None, "encrypted_content": sealed},
                {
                    "type": "function_call",
                    "name": "shell",
                    "arguments": '{"command":["ls"]}',
                    "call_id": "call_1",
                },
                {
                    "type": "function_call_output",
                    "call_id": "call_1",
                    "output": [{"type": "input_text", "text": "a.py"}],
                },
                {"type": "reasoning", "summary": [], "content": None, "encrypted_content": None},
            ],
            "tools": [
                {
                    "type": "function",
                    "name": "shell",
                    "description": "Run",
                    "strict": False,
                    "parameters": {"type": "object"},
                }
            ],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "reasoning": {"effort": "medium", "summary": "auto"},
            "store": False,
            "stream": True,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "thread-1",
            "client_metadata": {"x-codex-installation-id": "abc"},
        },
        SEALER,
    )
    assert check_chat_body(body)["messages"] == [
        {"role": "system", "content": "You are Codex."},
        {"role": "developer", "content": "<permissions/>"},
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Look at the tree first.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"command":["ls"]}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
    ]
    assert body["tools"][0]["function"]["strict"] is False
    assert (body["tool_choice"], body["reasoning_effort"], body["stream"]) == (
        "auto",
        "medium",
        True,
    )


def test_calls_of_the_api_s_own_tools_in_the_history_are_tool_turns() -> None:
    """A conversation begun with OpenAI's tools goes on here: their calls and outputs are
    tool calls and tool messages; calls of tools no one here ran are dropped, noted."""
    body, _, notes = noted(
        {
            "input": [
                {"role": "user", "content": "Patch it."},
                {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {}},
                {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*"},
                {"type": "custom_tool_call_output", "call_id": "c1", "output": "ok"},
                {
                    "type": "local_shell_call",
                    "id": "ls_1",
                    "call_id": "c2",
                    "status": "completed",
                    "action": {"type": "exec", "command": ["ls"], "env": {}},
                },
                {"type": "local_shell_call_output", "id": "c2", "output": "a.py"},
                {"type": "shell_call", "call_id": "c3", "action": {"commands": ["pwd"]}},
                {
                    "type": "shell_call_output",
                    "call_id": "c3",
                    "output": [{"stdout": "/w", "stderr": "", "outcome": {"type": "exit"}}],
                },
            ]
        }
    )
    calls = [
        (m["tool_calls"][0]["id"], m["tool_calls"][0]["function"]) for m in body["messages"][1::2]
    ]
    assert calls == [
        ("c1", {"name": "apply_patch", "arguments": '{"input":"*"}'}),
        ("c2", {"name": "local_shell", "arguments": '{"type":"exec","command":["ls"],"env":{}}'}),
        ("c3", {"name": "shell", "arguments": '{"commands":["pwd"]}'}),
    ]
    outputs = [(m["tool_call_id"], m["content"]) for m in body["messages"][2::2]]
    assert outputs == [
        ("c1", "ok"),
        ("c2", "a.py"),
        ("c3", '[{"stdout":"/w","stderr":"","outcome":{"type":"exit"}}]'),
    ]
    assert notes == {"input_items_dropped": {"web_search_call": 1}}


@pytest.mark.parametrize(
    ("request_", "message", "code"),
    [
        ({"frobnicate": 1}, "Unknown parameter: 'frobnicate'.", "unknown_parameter"),
        (
            {"max_output_tokens": "many"},
            "Invalid type for 'max_output_tokens': expected an integer, but got a string instead.",
            "invalid_type",
        ),
        ({"input": None}, "Missing required parameter: 'input'.", "missing_required_parameter"),
        (
            {"input": [{"role": "tool", "content": "x"}]},
            "Invalid value: 'tool'. Supported values are: 'user', 'system', 'developer', and "
            "'assistant'.",
            "invalid_value",
        ),
        (
            {"tool_choice": "sometimes"},
            "Invalid value: 'sometimes'. Supported values are: 'none', 'auto', and 'required'.",
            "invalid_value",
        ),
        (
            {"input": []},
            "Invalid 'input': empty array. Expected an array with minimum length 1, but got an "
            "empty array instead.",
            "empty_array",
        ),
        (
            {"conversation": "conv_1"},
            "Unsupported parameter: 'conversation' is not supported with this model. The gateway "
            "keeps no conversations: send the whole conversation in 'input'.",
            "unsupported_parameter",
        ),
        (
            {"include": ["file_search_call.results"]},
            "Unsupported value: 'include' does not support 'file_search_call.results' with this "
            "model. The gateway can include only 'reasoning.encrypted_content' (always sent with "
            "reasoning).",
            "unsupported_value",
        ),
    ],
)
def test_refusals_are_in_openai_s_words(request_: dict[str, Any], message: str, code: str) -> None:
    error = refused(request_)
    assert (error.message, error.code) == (message, code)
