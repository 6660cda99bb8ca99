"""A caller's body with any one field of the wrong type is refused at the front with a 400, or
every adapter prepares it: never a fault inside the gateway (a 500)."""

from __future__ import annotations

import contextlib
import copy
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boundedcode_gateway.config import parse_config
from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.ingress.validate import check_chat_body
from boundedcode_gateway.json_values import NESTING_LIMIT, nesting_error, raise_if_too_deep
from boundedcode_gateway.policy.capabilities import check_request
from boundedcode_gateway.policy.history_diff import message_digest
from boundedcode_gateway.policy.structured import requested_schema
from boundedcode_gateway.providers.base import ChatCall, RequestOptions
from boundedcode_gateway.providers.registry import REASONING_FILES, build_upstream
from boundedcode_gateway.reasoning_store.store import ReasoningStore, TaskReasoning
from boundedcode_gateway.upstream.capabilities import Capabilities

CONFIG = parse_config(
    """
models:
  local: {provider: local, external_url: "http://127.0.0.1:9"}
  gpt: {provider: openai, api_key_env: HOSTILE_BODIES_KEY}
  glm: {provider: openai-compatible, base_url: "http://127.0.0.1:9/v4"}
  claude: {provider: anthropic, api_key_env: HOSTILE_BODIES_KEY}
  gem: {provider: gemini, api_key_env: HOSTILE_BODIES_KEY}
"""
)
CAPS = Capabilities(
    streaming=True,
    reasoning_back=True,
    structured_output=True,
    prompt_progress=False,
    source="documentation",
)
OPTIONS = RequestOptions(stream=False, include_usage=False, return_progress=False)

# a body with every field the gateway or an adapter reads
BASE: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "s"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
        {
            "role": "assistant",
            "content": "c",
            "reasoning_content": "r",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "x", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "r"},
        {"role": "user", "content": "go"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "x",
                "description": "d",
                "parameters": {"type": "object", "properties": {"p": {"type": "string"}}},
            },
        }
    ],
    "tool_choice": {"type": "function", "function": {"name": "x"}},
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "a", "schema": {"type": "object"}},
    },
    "stream_options": {"include_usage": True},
    "reasoning_effort": "low",
    "stop": ["x"],
    "max_tokens": 10,
    "temperature": 0.5,
    "metadata": {"a": "b"},
    "n": 1,
    "seed": 1,
    "parallel_tool_calls": True,
}
REPLACEMENTS: list[Any] = [
    "s",
    "é\x00",
    7,
    -1,
    2**64 - 1,
    1.5,
    True,
    None,
    [],
    [1],
    {},
    {"ключ": 1},
]


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*path, i))


PATHS = [p for p in _paths(BASE) if p not in ((), ("model",))]


def _replaced(path: tuple[Any, ...], replacement: Any) -> dict[str, Any]:
    body = copy.deepcopy(BASE)
    holder = body
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = replacement
    return body


def _prepare_everywhere(body: dict[str, Any]) -> None:
    """What a call does with a body before it sends it, for every kind of upstream."""
    for message in body["messages"]:
        message_digest(message)
    upstreams = {
        name: build_upstream(name, profile, CONFIG, None)  # type: ignore[arg-type]
        for name, profile in CONFIG.models.items()
    }
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as env:
        env.setenv("HOSTILE_BODIES_KEY", "sk-test")
        store = ReasoningStore(Path(folder), REASONING_FILES)
        try:
            for name, upstream in upstreams.items():
                caller_body = {**body, "model": name}
                check_request(caller_body, CAPS, name)
                call = ChatCall(
                    caller_body,
                    OPTIONS,
                    CAPS,
                    requested_schema(caller_body),
                    TaskReasoning(store, "t"),
                    "call-1",
                )
                for send_schema in (True, False):
                    upstream.prepare(call, send_schema=send_schema)
        finally:
            store.close()


@settings(max_examples=300, deadline=None)
@given(path=st.sampled_from(PATHS), replacement=st.sampled_from(REPLACEMENTS))
def test_a_wrong_type_anywhere_is_a_400_or_is_prepared(
    path: tuple[Any, ...], replacement: Any
) -> None:
    body = _replaced(path, replacement)
    try:
        checked = check_chat_body(body)
    except InvalidRequest as exc:
        assert exc.http_status == 400 and exc.param
        return
    # a capability or schema the request cannot have is a 400 as well
    with contextlib.suppress(InvalidRequest):
        _prepare_everywhere(checked)


@pytest.mark.parametrize(
    ("path", "param"),
    [
        (("messages", 2, "tool_calls", 0, "function"), "messages[2].tool_calls[0].function"),
        (("messages", 2, "tool_calls", 0), "messages[2].tool_calls[0]"),
        (("tools", 0, "function"), "tools[0].function"),
        (("tool_choice", "function"), "tool_choice.function"),
        (("tool_choice",), "tool_choice"),
    ],
)
@pytest.mark.parametrize("replacement", ["x", 7, [1], True])
def test_a_function_that_is_not_an_object_names_its_field(
    path: tuple[Any, ...], param: str, replacement: Any
) -> None:
    if path == ("tool_choice",) and isinstance(replacement, str):
        return  # "auto", "none", "required": a string is a tool choice
    with pytest.raises(InvalidRequest) as caught:
        check_chat_body(_replaced(path, replacement))
    assert caught.value.param == param
    assert caught.value.code == "invalid_type"


def test_a_missing_function_or_name_is_refused() -> None:
    call = BASE["messages"][2]["tool_calls"][0]
    without = _replaced(
        ("messages", 2, "tool_calls", 0), {k: v for k, v in call.items() if k != "function"}
    )
    with pytest.raises(InvalidRequest) as caught:
        check_chat_body(without)
    assert caught.value.code == "missing_required_parameter"
    nameless = _replaced(("tools", 0, "function"), {"parameters": {}})
    with pytest.raises(InvalidRequest) as caught:
        check_chat_body(nameless)
    assert caught.value.param == "tools[0].function.name"


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_nesting_is_measured_and_named() -> None:
    assert nesting_error({"a": _nested(NESTING_LIMIT - 1)}) is None
    error = nesting_error({"model": "m", "messages": [{"role": "user", "x": _nested(300)}]})
    assert error is not None
    assert error.code == "nested_too_deeply" and error.http_status == 400
    assert error.param == "messages[0].x[0]"


def test_a_body_too_deep_to_encode_again_is_a_400() -> None:
    body = {**BASE, "extra": _nested(300)}
    with pytest.raises(TypeError):
        _prepare_everywhere(body)  # what the gateway did with it: a fault, a 500
    with pytest.raises(InvalidRequest) as caught:
        raise_if_too_deep(body)
    assert caught.value.param == "extra[0][0][0]"
    raise_if_too_deep(BASE)  # a body of ordinary depth: the failure is the gateway's own
