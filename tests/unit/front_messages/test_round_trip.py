"""A Messages request made a chat body and back keeps every field the chat form carries.

``to_messages`` below is the inverse of the front's translation, written for this
test only. The requests are drawn in the one form the chat body can tell apart
(an assistant turn of text only is a string; a tool result of one text block is its
text), so the round trip must give back exactly the request, less the fields the
front ignores and its thinking budget, which the chat form holds as an effort.
"""

from __future__ import annotations

from typing import Any

import orjson
from anthropic.types.message_create_params import MessageCreateParams
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from boundedcode_gateway.fronts.messages.request import ERROR_MARK, to_chat_body
from boundedcode_gateway.fronts.messages.response import thinking_signature
from boundedcode_gateway.fronts.sealing import Sealer
from boundedcode_gateway.ingress.validate import check_chat_body

SEALER = Sealer(b"\x07" * 32, clock=lambda: 1_800_000_000.0)
_PARAMS = TypeAdapter(MessageCreateParams)
_MARK = ERROR_MARK.strip()


def _sig(profile: str, thinking: str) -> str:
    return thinking_signature(profile, thinking, SEALER.sign)


# ------------------------------------------------------------------ the inverse


def _image(part: dict[str, Any]) -> dict[str, Any]:
    url = part["image_url"]["url"]
    if url.startswith("data:"):
        head, _, data = url[5:].partition(",")
        source = {"type": "base64", "media_type": head.removesuffix(";base64"), "data": data}
    else:
        source = {"type": "url", "url": url}
    return {"type": "image", "source": source}


def _block(part: dict[str, Any]) -> dict[str, Any]:
    return {"type": "text", "text": part["text"]} if part["type"] == "text" else _image(part)


def _tool_result(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "tool_result", "tool_use_id": message["tool_call_id"]}
    content = message["content"]
    if isinstance(content, str):
        if content == _MARK or content.startswith(ERROR_MARK):
            out["is_error"] = True
            content = content.removeprefix(_MARK).removeprefix(" ")
        out["content"] = content
        return out
    if content and content[0] == {"type": "text", "text": _MARK}:
        out["is_error"] = True
        content = content[1:]
    out["content"] = [_block(p) for p in content]
    return out


def _assistant(message: dict[str, Any], profile: str) -> dict[str, Any]:
    calls = message.get("tool_calls") or []
    reasoning = message.get("reasoning_content")
    if not calls and reasoning is None:
        return {"role": "assistant", "content": message["content"]}
    blocks: list[dict[str, Any]] = []
    if reasoning is not None:
        blocks.append(
            {"type": "thinking", "thinking": reasoning, "signature": _sig(profile, reasoning)}
        )
    if message["content"] is not None:
        blocks.append({"type": "text", "text": message["content"]})
    for call in calls:
        function = call["function"]
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": function["name"],
                "input": orjson.loads(function["arguments"]),
            }
        )
    return {"role": "assistant", "content": blocks}


def _user_turn(run: list[dict[str, Any]]) -> dict[str, Any]:
    if len(run) == 1 and run[0]["role"] == "user" and isinstance(run[0]["content"], str):
        return {"role": "user", "content": run[0]["content"]}
    blocks: list[dict[str, Any]] = []
    for message in run:
        if message["role"] == "tool":
            blocks.append(_tool_result(message))
        else:
            blocks.extend(_block(p) for p in message["content"])
    return {"role": "user", "content": blocks}


def _turns(messages: list[dict[str, Any]], profile: str) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "assistant":
            if run:
                turns.append(_user_turn(run))
                run = []
            turns.append(_assistant(message, profile))
        else:
            run.append(message)
    if run:
        turns.append(_user_turn(run))
    return turns


def _tools(chat: dict[str, Any], out: dict[str, Any]) -> None:
    if "tools" in chat:
        out["tools"] = []
        for tool in chat["tools"]:
            function = tool["function"]
            back = {"name": function["name"], "input_schema": function["parameters"]}
            if "description" in function:
                back["description"] = function["description"]
            if function.get("strict"):
                back["strict"] = True
            out["tools"].append(back)
    choice = chat.get("tool_choice")
    if choice is not None:
        if isinstance(choice, dict):
            back = {"type": "tool", "name": choice["function"]["name"]}
        else:
            back = {"type": {"auto": "auto", "required": "any", "none": "none"}[choice]}
        if chat.get("parallel_tool_calls") is False:
            back["disable_parallel_tool_use"] = True
        out["tool_choice"] = back


def to_messages(chat: dict[str, Any]) -> dict[str, Any]:
    """The Messages request a chat body stands for."""
    messages = chat["messages"]
    out: dict[str, Any] = {"model": chat["model"], "max_tokens": chat["max_completion_tokens"]}
    if messages[0]["role"] == "system":
        content = messages[0]["content"]
        out["system"] = content if isinstance(content, str) else [_block(p) for p in content]
        messages = messages[1:]
    out["messages"] = _turns(messages, chat["model"])
    for name in ("temperature", "top_p", "top_k", "stream"):
        if name in chat:
            out[name] = chat[name]
    if "stop" in chat:
        out["stop_sequences"] = chat["stop"]
    if "user" in chat:
        out["metadata"] = {"user_id": chat["user"]}
    if "response_format" in chat:
        schema = chat["response_format"]["json_schema"]["schema"]
        out["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
    _tools(chat, out)
    return out


# ------------------------------------------------------------------ the requests

_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
_NAME = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_-]{0,10}", fullmatch=True)
_ID = st.from_regex(r"toolu_[a-zA-Z0-9]{1,8}", fullmatch=True)
_VALUE = st.integers(-1000, 1000) | _TEXT | st.booleans()
_CACHE: st.SearchStrategy[dict[str, Any]] = st.just(
    {"cache_control": {"type": "ephemeral"}}
) | st.just({})
_IMAGE = st.builds(
    lambda media, data: {
        "type": "image",
        "source": {"type": "base64", "media_type": media, "data": data},
    },
    st.sampled_from(["image/png", "image/jpeg"]),
    st.from_regex(r"[A-Za-z0-9+/]{4,16}", fullmatch=True),
) | st.builds(
    lambda url: {"type": "image", "source": {"type": "url", "url": url}},
    st.from_regex(r"https://example\.com/[a-z]{1,8}\.png", fullmatch=True),
)
_TEXT_BLOCK = st.builds(lambda t, c: {"type": "text", "text": t, **c}, _TEXT, _CACHE)
# a result's text that does not read as the error mark
_RESULT_TEXT = _TEXT.filter(lambda t: not t.startswith(_MARK))


@st.composite
def tool_results(draw: st.DrawFn) -> dict[str, Any]:
    content: Any = draw(
        _RESULT_TEXT
        | st.lists(_TEXT_BLOCK | _IMAGE, min_size=2, max_size=3).filter(
            lambda b: b[0] != {"type": "text", "text": _MARK}
        )
        | st.lists(_IMAGE, min_size=1, max_size=1)
    )
    block = {"type": "tool_result", "tool_use_id": draw(_ID), "content": content}
    if draw(st.booleans()):
        block["is_error"] = True
    return block


_USER = _TEXT | st.lists(_TEXT_BLOCK | _IMAGE | tool_results(), min_size=1, max_size=4)


@st.composite
def assistant_turns(draw: st.DrawFn, profile: str) -> Any:
    calls = draw(
        st.lists(
            st.builds(
                lambda i, n, a: {"type": "tool_use", "id": i, "name": n, "input": a},
                _ID,
                _NAME,
                st.dictionaries(_NAME, _VALUE, max_size=3),
            ),
            max_size=2,
        )
    )
    thinking = draw(st.none() | _TEXT.filter(bool))
    text = draw(st.none() | _TEXT)
    if not calls and thinking is None:
        return text if text is not None else ""
    blocks: list[dict[str, Any]] = []
    if thinking is not None:
        blocks.append(
            {"type": "thinking", "thinking": thinking, "signature": _sig(profile, thinking)}
        )
    if text is not None:
        blocks.append({"type": "text", "text": text})
    return blocks + calls


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    turns = draw(st.integers(1, 5))
    profile = draw(_NAME)
    messages = [
        {"role": "user", "content": draw(_USER)}
        if i % 2 == 0
        else {"role": "assistant", "content": draw(assistant_turns(profile))}
        for i in range(turns)
    ]
    request: dict[str, Any] = {
        "model": profile,
        "max_tokens": draw(st.integers(0, 100_000)),
        "messages": messages,
    }
    system = draw(st.none() | _TEXT.filter(bool) | st.lists(_TEXT_BLOCK, min_size=2, max_size=3))
    if system is not None:
        request["system"] = system
    for name, values in (
        ("temperature", st.floats(0, 1)),
        ("top_p", st.floats(0, 1)),
        ("top_k", st.integers(1, 100)),
        ("stream", st.booleans()),
        ("stop_sequences", st.lists(_TEXT, min_size=1, max_size=3)),
        ("metadata", st.builds(lambda u: {"user_id": u}, _NAME)),
        (
            "output_config",
            st.builds(
                lambda s: {"format": {"type": "json_schema", "schema": s}},
                st.just({"type": "object"}),
            ),
        ),
        ("service_tier", st.just("auto")),
    ):
        if draw(st.booleans()):
            request[name] = draw(values)
    if draw(st.booleans()):
        tools = draw(
            st.lists(
                st.builds(
                    lambda n, d, s, c: {
                        "name": n,
                        "input_schema": {"type": "object"},
                        **d,
                        **s,
                        **c,
                    },
                    _NAME,
                    st.just({}) | st.builds(lambda t: {"description": t}, _TEXT),
                    st.just({}) | st.just({"strict": True}),
                    _CACHE,
                ),
                min_size=1,
                max_size=3,
            )
        )
        request["tools"] = tools
        choice = draw(
            st.sampled_from(
                [
                    {"type": "auto"},
                    {"type": "any"},
                    {"type": "none"},
                    {"type": "tool", "name": tools[0]["name"]},
                ]
            )
        )
        if choice["type"] != "none" and draw(st.booleans()):
            choice = {**choice, "disable_parallel_tool_use": True}
        request["tool_choice"] = choice
    return request


def _carried(request: dict[str, Any]) -> dict[str, Any]:
    """The request less what the front ignores."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "cache_control"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    out = strip(request)
    out.pop("service_tier", None)
    if out.get("stream") is False:
        del out["stream"]
    return out  # type: ignore[no-any-return]


@settings(max_examples=300, deadline=None)
@given(request=requests())
def test_a_request_made_a_chat_body_and_back_is_the_request(request: dict[str, Any]) -> None:
    _PARAMS.validate_python(request)
    chat = check_chat_body(to_chat_body(request, SEALER.verify))
    assert to_messages(chat) == _carried(request)
