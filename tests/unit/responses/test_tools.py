"""Tools of a Responses request: namespaces flattened into uniquely named functions and
their calls named back by namespace, built-in tools dropped, tool_choice in chat's form;
and Codex's own request, as Codex 0.171.0 sent it, taken whole."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.fronts.responses.request import to_chat_request
from boundedcode_gateway.fronts.responses.response import (
    Frame,
    from_chat_completion,
    function_call_item,
)
from boundedcode_gateway.fronts.responses.stream import ResponsesStream
from boundedcode_gateway.fronts.responses.tools import BUILT_IN, MAX_NAME, joined, served_tools
from boundedcode_gateway.fronts.sealing import Sealer
from boundedcode_gateway.ingress.validate import check_chat_body

SEALER = Sealer(b"\x07" * 32, clock=lambda: 1_800_000_000.0)
CODEX = Path(__file__).parents[2] / "fixtures" / "codex"


def codex_request(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CODEX / f"responses_{name}.json").read_text())
    return loaded


def function(name: str, **extra: Any) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {"type": "object"}, **extra}


AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [
        function("spawn_agent", description="Spawn one."),
        function("wait_agent"),
    ],
}


def opened(request: dict[str, Any]) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    notes: dict[str, Any] = {}
    body, echo = to_chat_request({"model": "local", "input": "hi", **request}, SEALER, notes)
    return check_chat_body(body), echo, notes


def test_a_namespace_is_flattened_into_its_functions() -> None:
    body, echo, notes = opened({"tools": [function("exec_command"), AGENTS]})
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "exec_command", "parameters": {"type": "object"}},
        },
        {
            "type": "function",
            "function": {
                "name": "multi_agent_v1__spawn_agent",
                # the namespace's description is the model's only word of what it groups
                "description": "Tools for spawning and managing sub-agents.\n\nSpawn one.",
                "parameters": {"type": "object"},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "multi_agent_v1__wait_agent",
                "description": "Tools for spawning and managing sub-agents.",
                "parameters": {"type": "object"},
            },
        },
    ]
    assert notes == {"tools_flattened": ["multi_agent_v1"]}
    assert [t["type"] for t in echo.tools] == ["function", "namespace"]
    assert [t["name"] for t in echo.tools[1]["tools"]] == ["spawn_agent", "wait_agent"]


def test_a_flat_name_steps_aside_for_a_function_of_that_name() -> None:
    body, echo, _ = opened({"tools": [AGENTS, function("multi_agent_v1__spawn_agent")]})
    names = [t["function"]["name"] for t in body["tools"]]
    assert names == [
        "multi_agent_v1__spawn_agent",
        "multi_agent_v1__spawn_agent_2",
        "multi_agent_v1__wait_agent",
    ]
    assert echo.names.called("multi_agent_v1__spawn_agent") == ("multi_agent_v1__spawn_agent", None)
    assert echo.names.called("multi_agent_v1__spawn_agent_2") == ("spawn_agent", "multi_agent_v1")


NAMES = st.text("ab_.", min_size=1, max_size=40)


@given(
    # (namespace, function, whether a plain function takes the pair's flat name too)
    st.lists(st.tuples(NAMES, NAMES, st.booleans()), max_size=12),
    st.lists(st.text("ab_", min_size=1, max_size=70), max_size=6, unique=True),
)
def test_every_flat_name_is_unique_and_names_its_function_back(
    spaced: list[tuple[str, str, bool]], others: list[str]
) -> None:
    plain = list(dict.fromkeys([*others, *(joined(ns, n) for ns, n, taken in spaced if taken)]))
    spaces: dict[str, list[str]] = {}
    for namespace, name, _ in spaced:
        if name not in spaces.setdefault(namespace, []):
            spaces[namespace].append(name)
    tools: list[dict[str, Any]] = [function(n) for n in plain]
    tools += [
        {"type": "namespace", "name": ns, "description": "", "tools": [function(n) for n in names]}
        for ns, names in spaces.items()
    ]
    served = served_tools(tools)
    chat_names = [t["function"]["name"] for t in served.chat]
    assert len(chat_names) == len(set(chat_names))
    flat = chat_names[len(plain) :]
    # names an OpenAI-shaped upstream takes
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", n) for n in flat)
    assert MAX_NAME == 64
    expected = [(ns, n) for ns, names in spaces.items() for n in names]
    assert [served.names.called(n) for n in flat] == [(n, ns) for ns, n in expected]
    assert [served.names.flat(ns, n) for ns, n in expected] == flat


def test_a_call_of_a_flat_name_is_given_back_by_namespace() -> None:
    _, echo, _ = opened({"tools": [function("exec_command"), AGENTS]})
    frame = Frame(echo, "resp_1", 1)
    completion = {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {
                                "name": "multi_agent_v1__wait_agent",
                                "arguments": '{"targets":["a"]}',
                            },
                        },
                        {
                            "id": "call_2",
                            "type": "function",
                            "function": {"name": "exec_command", "arguments": "{}"},
                        },
                    ],
                },
            }
        ]
    }
    output = from_chat_completion(completion, frame, SEALER)["output"]
    assert [(o["name"], o.get("namespace"), o["call_id"]) for o in output] == [
        ("wait_agent", "multi_agent_v1", "call_1"),
        ("exec_command", None, "call_2"),
    ]


def test_a_streamed_call_of_a_flat_name_is_given_back_by_namespace() -> None:
    _, echo, _ = opened({"tools": [AGENTS], "stream": True})
    stream = ResponsesStream(Frame(echo, "resp_1", 1), SEALER)
    call = {"index": 0, "id": "call_1", "function": {"name": "multi_agent_v1__spawn_agent"}}
    chunks = [
        {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    raw = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    out = (stream.feed(raw + b"data: [DONE]\n\n") + stream.end()).decode()
    events = [json.loads(line[6:]) for line in out.splitlines() if line.startswith("data: ")]
    items = [e["item"] for e in events if e["type"].startswith("response.output_item.")]
    assert [(i["name"], i["namespace"]) for i in items] == [("spawn_agent", "multi_agent_v1")] * 2
    final = events[-1]["response"]["output"][0]
    assert (final["name"], final["namespace"], final["arguments"]) == (
        "spawn_agent",
        "multi_agent_v1",
        "{}",
    )


def test_an_input_call_with_its_namespace_goes_to_the_model_by_its_flat_name() -> None:
    body, _, _ = opened(
        {
            "tools": [AGENTS],
            "input": [
                {"role": "user", "content": "go"},
                {
                    "type": "function_call",
                    "name": "wait_agent",
                    "namespace": "multi_agent_v1",
                    "arguments": "{}",
                    "call_id": "c1",
                },
                {"type": "function_call_output", "call_id": "c1", "output": "done"},
                # a namespace no longer offered: Codex's own flat form
                {
                    "type": "function_call",
                    "name": "lookup",
                    "namespace": "crm_",
                    "arguments": "{}",
                    "call_id": "c2",
                },
                {"type": "function_call_output", "call_id": "c2", "output": "x"},
            ],
        }
    )
    calls = [m["tool_calls"][0]["function"]["name"] for m in body["messages"] if "tool_calls" in m]
    assert calls == ["multi_agent_v1__wait_agent", "crm__lookup"]


@pytest.mark.parametrize(
    ("choice", "chat_choice"),
    [
        ({"type": "function", "name": "exec_command"}, "exec_command"),
        ({"type": "function", "name": "wait_agent"}, "multi_agent_v1__wait_agent"),
        (
            {"type": "function", "name": "wait_agent", "namespace": "multi_agent_v1"},
            "multi_agent_v1__wait_agent",
        ),
        ({"type": "function", "name": "multi_agent_v1__wait_agent"}, "multi_agent_v1__wait_agent"),
    ],
)
def test_a_chosen_function_is_named_as_the_model_knows_it(choice: Any, chat_choice: str) -> None:
    body, echo, _ = opened({"tools": [function("exec_command"), AGENTS], "tool_choice": choice})
    assert body["tool_choice"] == {"type": "function", "function": {"name": chat_choice}}
    assert echo.tool_choice == choice


def test_allowed_tools_narrow_what_the_model_is_offered() -> None:
    body, _, _ = opened(
        {
            "tools": [function("exec_command"), function("view_image"), AGENTS],
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [
                    {"type": "function", "name": "view_image"},
                    {"type": "namespace", "name": "multi_agent_v1"},
                ],
            },
        }
    )
    assert [t["function"]["name"] for t in body["tools"]] == [
        "view_image",
        "multi_agent_v1__spawn_agent",
        "multi_agent_v1__wait_agent",
    ]
    assert body["tool_choice"] == "required"


def test_a_malformed_namespace_is_named() -> None:
    with pytest.raises(InvalidRequest) as info:
        opened({"tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "function"}]}]})
    assert (info.value.param, info.value.code) == (
        "tools[0].tools[0].name",
        "missing_required_parameter",
    )


def test_a_flat_name_is_codex_s_own_form() -> None:
    assert joined("multi_agent_v1", "spawn_agent") == "multi_agent_v1__spawn_agent"
    assert joined("crm_", "_lookup") == "crm__lookup"
    assert function_call_item("fc_1", "c", "f", "{}", "completed") == {
        "id": "fc_1",
        "type": "function_call",
        "call_id": "c",
        "name": "f",
        "arguments": "{}",
        "status": "completed",
    }


def test_codex_s_first_request_is_taken_as_it_is() -> None:
    """Codex 0.171.0's own first request (``codex exec``, its default tools)."""
    request = codex_request("first_turn")
    assert sorted(request) == [
        "client_metadata",
        "include",
        "input",
        "model",
        "parallel_tool_calls",
        "prompt_cache_key",
        "reasoning",
        "store",
        "stream",
        "tool_choice",
        "tools",
    ]
    notes: dict[str, Any] = {}
    body, _ = to_chat_request(request, SEALER, notes)
    body = check_chat_body(body)
    assert notes == {"tools_dropped": ["web_search"], "tools_flattened": ["multi_agent_v1"]}
    names = [t["function"]["name"] for t in body["tools"]]
    assert names[:4] == ["exec_command", "write_stdin", "request_user_input", "view_image"]
    assert "multi_agent_v1__spawn_agent" in names
    assert [m["role"] for m in body["messages"]] == ["developer", "developer", "user", "user"]
    assert (body["stream"], body["tool_choice"], body["parallel_tool_calls"]) == (
        True,
        "auto",
        True,
    )


def test_codex_s_request_after_a_namespaced_call_gives_the_model_its_flat_name() -> None:
    body, _ = to_chat_request(codex_request("after_two_tool_calls"), SEALER)
    calls = [
        (m["tool_calls"][0]["id"], m["tool_calls"][0]["function"]["name"])
        for m in check_chat_body(body)["messages"]
        if m.get("tool_calls")
    ]
    assert calls == [("call_ns1", "multi_agent_v1__close_agent"), ("call_ex1", "exec_command")]


def _literal_types(union: Any) -> set[str]:
    """The ``type`` values of a union of the SDK's TypedDicts."""
    kinds: set[str] = set()
    for member in typing.get_args(union):
        hints = typing.get_type_hints(member)
        for arg in typing.get_args(hints["type"]):
            kinds.update(a for a in typing.get_args(arg) if isinstance(a, str))
            if isinstance(arg, str):
                kinds.add(arg)
    return kinds


def test_every_field_tool_and_item_of_the_sdk_has_a_fate() -> None:
    """The installed ``openai`` SDK's own types are the list: each request field, tool type
    and input item type is mapped, taken, left out or refused by name, never unknown."""
    from openai.types.responses import response_create_params, response_input_item_param
    from openai.types.responses.tool_param import ToolParam

    from boundedcode_gateway.fronts.responses import request

    fields = set(typing.get_type_hints(response_create_params.ResponseCreateParamsBase))
    assert fields - request._KNOWN == set()
    tools = _literal_types(ToolParam)
    assert tools - {"function", "namespace"} - BUILT_IN == set()
    items = _literal_types(response_input_item_param.ResponseInputItemParam)
    assert items - set(request._ITEM_TYPES) == set()
