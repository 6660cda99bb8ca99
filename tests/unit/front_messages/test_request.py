"""Golden cases: Messages API requests in, the chat-completions bodies the gateway
answers out (fronts/messages/request.py).

The requests follow Anthropic's Messages API reference and are checked against the
official SDK's request type, so each one is a request Anthropic's own clients send.
"""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types.message_create_params import MessageCreateParams
from pydantic import TypeAdapter

from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.fronts.messages.request import check_headers, to_chat_body
from boundedcode_gateway.fronts.messages.response import thinking_signature
from boundedcode_gateway.fronts.sealing import Sealer
from boundedcode_gateway.ingress.validate import check_chat_body

SEALER = Sealer(b"\x07" * 32, clock=lambda: 1_800_000_000.0)
OTHER = Sealer(b"\x08" * 32, clock=lambda: 1_800_000_000.0)


def sig(text: str, profile: str = "local", sealer: Sealer = SEALER) -> str:
    """The signature the gateway gave a thinking block ``profile`` wrote."""
    return thinking_signature(profile, text, sealer.sign)


_PARAMS = TypeAdapter(MessageCreateParams)
HEADERS = {"anthropic-version": "2023-06-01"}


def chat(request: dict[str, Any], *, sdk_type: bool = True, **kw: Any) -> dict[str, Any]:
    if sdk_type:
        _PARAMS.validate_python(request)  # a request the official SDK would send
    out = to_chat_body(request, SEALER.verify, **kw)
    assert check_chat_body(out) is out  # the chat path takes it as it is
    return out


def refused(request: dict[str, Any], **kw: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        to_chat_body(request, SEALER.verify, **kw)
    return caught.value


def base(**extra: Any) -> dict[str, Any]:
    return {
        "model": "local",
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": "hi"}],
        **extra,
    }


def test_a_claude_code_turn_becomes_its_chat_body() -> None:
    reasoning = "The user wants the file list."
    request = {
        "model": "local",
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=a5145;"},
            {
                "type": "text",
                "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"},
            },
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "thinking",
                        "thinking": reasoning,
                        "signature": sig(reasoning),
                    },
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "."}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py\nb.py"},
                    {"type": "text", "text": "<system-reminder>Be careful.</system-reminder>"},
                ],
            },
        ],
        "tools": [
            {
                "name": "ls",
                "description": "List a folder",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
                "cache_control": {"type": "ephemeral"},
            }
        ],
        "tool_choice": {"type": "auto"},
        "metadata": {"user_id": "user_abc"},
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "temperature": 1,
        "stream": True,
    }
    assert chat(request) == {
        "model": "local",
        "messages": [
            {
                "role": "system",
                "content": [
                    {
                        "type": "text",
                        "text": "x-anthropic-billing-header: cc_version=2.1; cch=a5145;",
                    },
                    {"type": "text", "text": "You are Claude Code."},
                ],
            },
            {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
            {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "ls", "arguments": '{"path":"."}'},
                    }
                ],
                "reasoning_content": reasoning,
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "a.py\nb.py"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>Be careful.</system-reminder>"}
                ],
            },
        ],
        "max_completion_tokens": 32000,
        "temperature": 1,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "ls",
                    "description": "List a folder",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
                },
            }
        ],
        "tool_choice": "auto",
        "reasoning_effort": "high",
        "user": "user_abc",
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_thinking_the_gateway_did_not_sign_is_dropped() -> None:
    text = "reasoning"
    turns: list[Any] = [
        {"type": "thinking", "thinking": text, "signature": sig(text, sealer=OTHER)},
        {"type": "thinking", "thinking": text, "signature": sig(text, profile="other")},
        {"type": "thinking", "thinking": text + "!", "signature": sig(text)},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
        {"type": "text", "text": "Done."},
    ]
    out = chat(
        base(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": turns}])
    )
    assert out["messages"][1] == {"role": "assistant", "content": "Done."}


def test_a_turn_left_with_nothing_is_left_out() -> None:
    only = [{"type": "thinking", "thinking": "x", "signature": "EqQBCgIYAhIM"}]
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": only},
        {"role": "user", "content": "again"},
    ]
    assert [m["role"] for m in chat(base(messages=messages))["messages"]] == ["user", "user"]


def test_signed_thinking_of_several_blocks_is_joined_and_empty_thinking_is_none() -> None:
    blocks: list[Any] = [
        {"type": "thinking", "thinking": "one ", "signature": sig("one ")},
        {"type": "thinking", "thinking": "", "signature": sig("")},
        {"type": "tool_use", "id": "toolu_2", "name": "pwd", "input": {}},
        {"type": "thinking", "thinking": "two", "signature": sig("two")},
    ]
    message = chat(
        base(messages=[{"role": "user", "content": "?"}, {"role": "assistant", "content": blocks}])
    )["messages"][1]
    assert message["reasoning_content"] == "one two"
    assert message["content"] is None
    assert message["tool_calls"][0]["function"] == {"name": "pwd", "arguments": "{}"}


def test_images_tool_results_and_errors() -> None:
    content: list[Any] = [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "content": [
                {"type": "text", "text": "shot:"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
                },
            ],
        },
        {
            "type": "tool_result",
            "tool_use_id": "toolu_2",
            "content": "no such file",
            "is_error": True,
        },
        {"type": "tool_result", "tool_use_id": "toolu_3", "is_error": True},
        {
            "type": "tool_result",
            "tool_use_id": "toolu_4",
            "content": [{"type": "text", "text": "ok"}],
        },
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
    ]
    out = chat(base(messages=[{"role": "user", "content": content}]))["messages"]
    assert out == [
        {
            "role": "tool",
            "tool_call_id": "toolu_1",
            "content": [
                {"type": "text", "text": "shot:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such file"},
        {"role": "tool", "tool_call_id": "toolu_3", "content": "Error:"},
        {"role": "tool", "tool_call_id": "toolu_4", "content": "ok"},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}],
        },
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        (
            {"type": "tool", "name": "ls"},
            {"tool_choice": {"type": "function", "function": {"name": "ls"}}},
        ),
        (
            {"type": "any", "disable_parallel_tool_use": True},
            {"tool_choice": "required", "parallel_tool_calls": False},
        ),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: dict[str, Any]) -> None:
    tools = [{"name": "ls", "input_schema": {"type": "object"}}]
    out = chat(base(tools=tools, tool_choice=choice))
    assert {k: out[k] for k in ("tool_choice", "parallel_tool_calls") if k in out} == expected


@pytest.mark.parametrize(
    ("extra", "effort"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "low"),
        ({"thinking": {"type": "enabled", "budget_tokens": 8192}}, "medium"),
        ({"thinking": {"type": "enabled", "budget_tokens": 16384}}, "high"),
        ({"thinking": {"type": "disabled"}}, "none"),
        ({"thinking": {"type": "adaptive"}}, None),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "medium"}}, "medium"),
        ({"output_config": {"effort": "max"}}, "high"),
        ({}, None),
    ],
)
def test_thinking_becomes_reasoning_effort(extra: dict[str, Any], effort: str | None) -> None:
    assert chat(base(**extra)).get("reasoning_effort") == effort


def test_sampling_stops_schema_and_the_fields_that_change_nothing() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    out = chat(
        base(
            top_p=0.9,
            top_k=40,
            stop_sequences=["END"],
            output_config={"format": {"type": "json_schema", "schema": schema}},
            service_tier="auto",
            cache_control={"type": "ephemeral"},
            system="Be brief.",
        )
    )
    assert out == {
        "model": "local",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ],
        "max_completion_tokens": 1024,
        "top_p": 0.9,
        "top_k": 40,
        "stop": ["END"],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        },
    }


def test_claude_codes_context_management_changes_nothing_and_is_taken() -> None:
    # what Claude Code sends whenever it thinks: thinking cleared, all of it kept
    keep_all = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    request = base(thinking={"type": "adaptive"}, output_config={"effort": "medium"})
    _PARAMS.validate_python(request)
    assert to_chat_body({**request, "context_management": keep_all}, SEALER.verify) == chat(request)


def test_max_tokens_is_required_except_to_count() -> None:
    request = base()
    del request["max_tokens"]
    assert refused(request).message == "max_tokens: Field required"
    assert "max_completion_tokens" not in to_chat_body(request, SEALER.verify, counting=True)


@pytest.mark.parametrize(
    ("request_", "param"),
    [
        (base(mcp_servers=[{"type": "url", "url": "https://x", "name": "x"}]), "mcp_servers"),
        (
            base(context_management={"edits": [{"type": "clear_tool_uses_20250919"}]}),
            "context_management.edits.0",
        ),
        (
            base(
                context_management={
                    "edits": [
                        {
                            "type": "clear_thinking_20251015",
                            "keep": {"type": "thinking_turns", "value": 1},
                        }
                    ]
                }
            ),
            "context_management.edits.0.keep",
        ),
        (base(context_management={"edits": "all"}), "context_management.edits"),
        (base(frequency_penalty=1), "frequency_penalty"),
        (base(tools=[{"type": "memory_20250818", "name": "memory"}]), "tools.0.type"),
        (base(tools=[{"name": "t", "input_schema": {}, "cache": True}]), "tools.0.custom.cache"),
        (
            base(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]),
            "messages.0.content.0.source",
        ),
        (
            base(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "document",
                                "source": {"type": "base64", "media_type": "x", "data": "x"},
                            }
                        ],
                    }
                ]
            ),
            "messages.0.content.0.source.type",
        ),
        (base(thread={"type": "create"}), "thread"),
        (
            base(
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}],
                    }
                ]
            ),
            "messages.0.content.0.type",
        ),
        (base(messages=[{"role": "tool", "content": "x"}]), "messages.0.role"),
        (base(messages=[{"role": "user", "content": []}]), "messages.0"),
        (base(messages=[]), "messages"),
        (base(model=""), "model"),
        (base(thinking={"type": "enabled"}), "thinking.enabled.budget_tokens"),
        (base(output_config={"format": {"type": "text"}}), "output_config.format"),
        (
            base(
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
                    }
                ]
            ),
            "messages.0.content.0.source.type",
        ),
    ],
)
def test_what_the_chat_form_cannot_carry_is_refused_by_name(
    request_: dict[str, Any], param: str
) -> None:
    exc = refused(request_)
    assert exc.param == param
    assert exc.http_status == 400
    assert exc.message.startswith(param)


def test_the_version_header_is_required_and_known() -> None:
    assert check_headers(HEADERS).version == "2023-06-01"
    assert check_headers({"anthropic-version": "2026-10-21"}).version == "2026-10-21"
    with pytest.raises(InvalidRequest, match=r"^anthropic-version: header is required$"):
        check_headers({})
    for bad in ("2023-01-01", "2026-1-1", "latest"):
        with pytest.raises(InvalidRequest) as caught:
            check_headers({"anthropic-version": bad})
        assert caught.value.message == f'anthropic-version: "{bad}" is not a valid version'


def test_a_newer_dated_version_is_served_by_the_newest_rules_and_noted() -> None:
    rules = check_headers({"anthropic-version": "2099-01-01"})
    assert rules.version == "2026-10-21"
    notes: dict[str, Any] = {}
    chat(base(), rules=rules, adjustments=notes)
    assert notes == {"anthropic_version_served_as": "2099-01-01→2026-10-21"}
    with pytest.raises(InvalidRequest, match=r"^temperature: Extra inputs are not permitted$"):
        to_chat_body(base(temperature=1), SEALER.verify, rules=rules)


def test_the_discard_event_cannot_be_asked_for() -> None:
    check_headers({**HEADERS, "x-boundedcode-stream-discard": "0"})
    with pytest.raises(InvalidRequest, match="X-BoundedCode-Stream-Discard"):
        check_headers({**HEADERS, "x-boundedcode-stream-discard": "1"})


NEWEST = check_headers({"anthropic-version": "2026-10-21"})


def newest(request: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return chat(request, rules=NEWEST, **kw)


def refused_newest(request: dict[str, Any]) -> InvalidRequest:
    return refused(request, rules=NEWEST)


@pytest.mark.parametrize("name", ["temperature", "top_p", "top_k"])
def test_2026_10_21_has_no_sampling_parameters_even_at_their_defaults(name: str) -> None:
    value = 1 if name != "top_k" else 0
    assert refused_newest(base(**{name: value})).message == (
        f"{name}: Extra inputs are not permitted"
    )
    assert chat(base(**{name: value}), sdk_type=False)[name] == value  # 2023-06-01 maps it


DOCUMENT = {
    "type": "document",
    "source": {"type": "text", "media_type": "text/plain", "data": "The text."},
    "title": "notes.txt",
}
CITED = {
    "type": "text",
    "text": "as cited",
    "citations": [
        {
            "type": "char_location",
            "cited_text": "The text.",
            "document_index": 0,
            "start_char_index": 0,
            "end_char_index": 9,
        }
    ],
}


def test_2026_10_21_refuses_documents_from_the_assistant_and_citations_from_the_user() -> None:
    in_assistant = base(
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [DOCUMENT]},
        ]
    )
    exc = refused_newest(in_assistant)
    assert exc.message.startswith(
        "messages.1.content.0: Input tag 'document' found using 'type' does not match any of"
        " the expected tags: 'text', 'image', 'search_result'"
    )
    assert chat(in_assistant, sdk_type=False)["messages"][1] == {
        "role": "assistant",
        "content": "notes.txt\nThe text.",
    }
    cited = base(messages=[{"role": "user", "content": [CITED]}])
    assert refused_newest(cited).param == "messages.0.content.0.citations"
    assert chat(cited)["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "as cited"}]}
    ]
    in_search = {
        "type": "search_result",
        "source": "https://example.com",
        "title": "Example",
        "content": [CITED],
    }
    exc = refused_newest(base(messages=[{"role": "user", "content": [in_search]}]))
    assert exc.param == "messages.0.content.0.content.0.citations"
    # empty citations cite nothing, in any version
    plain = base(messages=[{"role": "user", "content": [{**CITED, "citations": []}]}])
    assert newest(plain) == chat(plain)


def test_documents_and_search_results_are_the_text_they_hold() -> None:
    search = {
        "type": "search_result",
        "source": "https://example.com/a",
        "title": "A",
        "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}],
    }
    out = newest(base(messages=[{"role": "user", "content": [DOCUMENT, search]}]))
    assert out["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "notes.txt\nThe text."},
                {"type": "text", "text": "A\nhttps://example.com/a\nfirst\nsecond"},
            ],
        }
    ]


def test_system_messages_in_messages_stay_where_they_come() -> None:
    request = base(
        system="Be brief.",
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "system", "content": [{"type": "text", "text": "Now in French."}]},
            {"role": "user", "content": "more"},
        ],
    )
    assert newest(request)["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "system", "content": "Now in French."},
        {"role": "user", "content": "more"},
    ]


def test_claude_codes_tools_and_anthropics_own() -> None:
    notes: dict[str, Any] = {}
    out = newest(
        base(
            tools=[
                {
                    "name": "read",
                    "description": "Read a file.",
                    "input_schema": {"type": "object"},
                    "defer_loading": True,
                    "input_examples": [{"path": "a.txt"}],
                    "eager_input_streaming": True,
                },
                {"type": "bash_20250124", "name": "bash"},
                {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
                {"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"},
                {"type": "code_execution_20250825", "name": "code_execution"},
                {
                    "name": "only_from_code",
                    "input_schema": {"type": "object"},
                    "allowed_callers": ["code_execution_20250825"],
                },
            ]
        ),
        adjustments=notes,
    )
    functions = [t["function"] for t in out["tools"]]
    assert [f["name"] for f in functions] == ["read", "bash", "str_replace_based_edit_tool"]
    assert functions[0]["description"] == 'Read a file.\n\nExamples of input:\n{"path":"a.txt"}'
    assert functions[1]["parameters"]["properties"]["command"] == {
        "type": "string",
        "description": "The bash command to run.",
    }
    assert notes == {
        "server_tools_dropped": [
            "tool_search_tool_bm25 (tool_search_tool_bm25_20251119)",
            "code_execution (code_execution_20250825)",
        ],
        "code_execution_only_tools_dropped": ["only_from_code"],
        "deferred_tools_loaded": 1,
    }


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (base(temperature="hot"), "temperature: Input should be a valid number"),
        (base(max_tokens="many"), "max_tokens: Input should be a valid integer"),
        (base(stream="yes"), "stream: Input should be a valid boolean"),
        (base(messages="hi"), "messages: Input should be a valid list"),
        (base(messages=[]), "messages: at least one message is required"),
        (
            base(messages=[{"role": "user", "content": [{"type": "foo"}]}]),
            "messages.0.content.0: Input tag 'foo' found using 'type' does not match any of the"
            " expected tags: 'text', 'image', 'document'",
        ),
        (
            base(messages=[{"role": "tool", "content": "x"}]),
            "messages.0.role: Input should be 'user', 'assistant' or 'system'",
        ),
        (
            base(tools=[{"name": "t", "input_schema": {}, "cache": 1}]),
            "tools.0.custom.cache: Extra inputs are not permitted",
        ),
        (base(mcp_servers=[{"type": "url", "url": "u", "name": "n"}]), "mcp_servers: the MCP"),
        (base(tool_choice={"type": "some"}), "tool_choice: Input tag 'some' found using 'type'"),
    ],
)
def test_refusals_are_worded_as_anthropic_words_them(
    request_: dict[str, Any], message: str
) -> None:
    assert refused(request_).message.startswith(message)


def test_fields_that_change_nothing_are_taken() -> None:
    quiet = base(
        service_tier="auto",
        inference_geo="us",
        container="container_1",
        speed="fast",
        diagnostics={"previous_message_id": "msg_1"},
        mcp_servers=[],
        thinking={"type": "adaptive", "display": "omitted"},
        output_config={"task_budget": {"type": "tokens", "total": 1000}},
    )
    assert newest(quiet, sdk_type=False) == newest(base())


def test_a_system_message_between_a_tool_call_and_its_result_follows_the_result() -> None:
    request = base(
        messages=[
            {"role": "user", "content": "read it"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "c1", "name": "read", "input": {}}],
            },
            {"role": "system", "content": "Mind the budget."},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "text"},
                    {"type": "text", "text": "go on"},
                ],
            },
        ]
    )
    roles = [m["role"] for m in chat(request)["messages"]]
    assert roles == ["user", "assistant", "tool", "system", "user"]
