"""Structured output: each provider's form, strict conversion, refusals, reply checks."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boundedcode_gateway.policy.structured import (
    is_schema_rejection,
    reply_matches,
    requested_schema,
    schema_verdict,
    strict_schema,
)
from boundedcode_gateway.providers.base import RequestOptions
from boundedcode_gateway.providers.openai_compat.dialects import (
    LLAMA_CPP,
    LOCAL_OPENAI_COMPATIBLE,
    OPENAI,
    OPENAI_COMPATIBLE,
)
from boundedcode_gateway.providers.openai_compat.mapping import to_openai_compat_request

# a nested schema with arrays, enums and optional fields, in the prompt's order
CONTRACT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string"},
        "risk": {"type": "string", "enum": ["low", "medium", "high"]},
        "steps": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"title": {"type": "string"}, "done": {"type": "boolean"}},
                "required": ["title"],
            },
        },
        "owner": {"type": "string"},
    },
    "required": ["summary", "risk", "steps"],
}

STRICT_CONTRACT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string"},
        "risk": {"type": "string", "enum": ["low", "medium", "high"]},
        "steps": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"title": {"type": "string"}, "done": {"type": ["boolean", "null"]}},
                "required": ["title", "done"],
                "additionalProperties": False,
            },
        },
        "owner": {"type": ["string", "null"]},
    },
    "required": ["summary", "risk", "steps", "owner"],
    "additionalProperties": False,
}

PLAIN = RequestOptions(stream=False, include_usage=False, return_progress=False)


def body_with(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "plan"}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "task_contract", "schema": schema},
        },
    }


def sent(dialect: Any, schema: dict[str, Any], send: bool = True) -> dict[str, Any]:
    body = body_with(schema)
    return to_openai_compat_request(
        body,
        model="m",
        dialect=dialect,
        options=PLAIN,
        takes_reasoning=False,
        schema=requested_schema(body),
        send_schema=send,
    )


def test_openai_and_compatible_get_the_strict_form() -> None:
    for dialect in (OPENAI, OPENAI_COMPATIBLE, LOCAL_OPENAI_COMPATIBLE):
        assert sent(dialect, CONTRACT)["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "task_contract", "schema": STRICT_CONTRACT, "strict": True},
        }


def test_llama_gets_the_schema_under_json_schema_schema() -> None:
    assert sent(LLAMA_CPP, CONTRACT)["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "task_contract", "schema": CONTRACT},
    }


def test_schema_at_the_top_level_is_moved_where_llama_reads_it() -> None:
    body = {
        "model": "m",
        "messages": [],
        "response_format": {"type": "json_schema", "schema": CONTRACT},
    }
    schema = requested_schema(body)
    assert schema is not None
    out = to_openai_compat_request(
        body | {"messages": [{"role": "user", "content": "x"}]},
        model="m",
        dialect=LLAMA_CPP,
        options=PLAIN,
        takes_reasoning=False,
        schema=schema,
    )
    assert out["response_format"]["json_schema"]["schema"] == CONTRACT


def test_dropped_schema_leaves_no_response_format() -> None:
    assert "response_format" not in sent(OPENAI, CONTRACT, send=False)


def test_strict_schema_is_left_as_it_is() -> None:
    assert strict_schema(STRICT_CONTRACT) == STRICT_CONTRACT


def test_tools_without_a_schema_are_untouched() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "response_format": {"type": "text"},
    }
    out = to_openai_compat_request(
        body, model="m", dialect=OPENAI, options=PLAIN, takes_reasoning=False
    )
    assert out["tools"] == body["tools"] and out["response_format"] == {"type": "text"}


@pytest.mark.parametrize(
    "message",
    [
        "Invalid schema for response_format 'task_contract': In context=(), 'required' is "
        "required to be supplied and to be an array including every key in properties.",
        "response_format json_schema is not supported by this model",
        "This model does not support structured output.",
        "output_config.format: schema is too complex",
        'Invalid JSON payload received. Unknown name "responseJsonSchema"',
        "JSON schema conversion failed: Unrecognized schema: {}",
    ],
)
def test_schema_refusals_are_recognised(message: str) -> None:
    assert is_schema_rejection(400, message)


def test_other_errors_are_not_schema_refusals() -> None:
    assert not is_schema_rejection(400, "Invalid value for 'temperature'")
    assert not is_schema_rejection(500, "response_format broke the server")


def test_reply_check() -> None:
    assert reply_matches('{"summary": "s", "risk": "low", "steps": []}', CONTRACT)
    assert not reply_matches('{"summary": "s", "risk": "extreme", "steps": []}', CONTRACT)
    assert not reply_matches("Sure! Here is the JSON:", CONTRACT)
    assert not reply_matches(None, CONTRACT)
    # strict mode made "owner" nullable: a null there is the gateway's doing, not the model's
    assert reply_matches('{"summary": "s", "risk": "low", "steps": [], "owner": null}', CONTRACT)


@pytest.mark.parametrize(
    ("text", "finish", "verdict"),
    [
        ('{"summary": "s", "risk": "low", "steps": []}', "stop", True),
        ("Sure! Here is the JSON:", "stop", False),
        ('{"summary": "s", "risk": "low"', "length", False),  # cut short: checked, and fails
        (None, "stop", False),  # no text where a reply was due
        (None, "tool_calls", None),  # tool calls: the reply comes on a later turn
        ("Let me look that up.", "tool_calls", None),
    ],
)
def test_schema_verdict(text: str | None, finish: str, verdict: bool | None) -> None:
    assert schema_verdict(text, finish, CONTRACT) is verdict


names = st.lists(st.from_regex(r"[a-z]{1,8}", fullmatch=True), min_size=1, max_size=8, unique=True)


@settings(max_examples=100, deadline=None)
@given(order=names, dialect=st.sampled_from([LLAMA_CPP, OPENAI, OPENAI_COMPATIBLE]))
def test_field_order_is_kept(order: list[str], dialect: Any) -> None:
    schema = {
        "type": "object",
        "properties": {n: {"type": "integer"} for n in order},
        "required": order[: len(order) // 2],
    }
    out = orjson.loads(orjson.dumps(sent(dialect, schema)))
    got = out["response_format"]["json_schema"]["schema"]
    assert list(got["properties"]) == order
