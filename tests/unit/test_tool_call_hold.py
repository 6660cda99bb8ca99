"""Tool calls held back until the finish (golden cases): what the caller is shown of an
answer at each point, and the calls whole at its end."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.providers.base import PartialAnswer, RequestOptions
from boundedcode_gateway.providers.openai_compat.stream import OpenAIStreamTranslator
from boundedcode_gateway.tool_call_hold import ToolCallHold

STREAMED = RequestOptions(stream=True, include_usage=True, return_progress=False)
HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 100, "model": "m"}


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return orjson.dumps({**HEAD, "choices": [choice]})


def call_head(index: int, call_id: str, name: str) -> dict[str, Any]:
    function = {"name": name, "arguments": ""}
    return {
        "tool_calls": [{"index": index, "id": call_id, "type": "function", "function": function}]
    }


def args(index: int, text: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, "function": {"arguments": text}}]}


ROLE = chunk({"role": "assistant", "content": None})
TEXT = [chunk({"content": "Let me "}), chunk({"content": "look."})]
CALLS = [
    chunk(call_head(0, "call_a", "read")),
    chunk(args(0, '{"path":')),
    chunk(args(0, ' "a"}')),
    chunk(call_head(1, "call_b", "read")),
    chunk(args(1, '{"path": "b"}')),
]
FINISH = chunk({}, "tool_calls")
USAGE = orjson.dumps({**HEAD, "choices": [], "usage": {"prompt_tokens": 3}})
WHOLE = [
    {
        "index": 0,
        "id": "call_a",
        "type": "function",
        "function": {"name": "read", "arguments": '{"path": "a"}'},
    },
    {
        "index": 1,
        "id": "call_b",
        "type": "function",
        "function": {"name": "read", "arguments": '{"path": "b"}'},
    },
]


def hold() -> ToolCallHold:
    return ToolCallHold(OpenAIStreamTranslator(STREAMED, keep_shown=True))


def fed(t: ToolCallHold, *events: bytes) -> list[Any]:
    out: list[Any] = []
    for data in events:
        out += [orjson.loads(p) for p in t.feed("", data)]
    return out


def deltas(out: list[Any]) -> list[Any]:
    return [c["choices"][0]["delta"] for c in out if c.get("choices")]


def test_text_passes_as_it_comes_and_the_calls_come_whole_before_the_finish() -> None:
    t = hold()
    assert deltas(fed(t, ROLE, *TEXT)) == [
        {"role": "assistant", "content": None},
        {"content": "Let me "},
        {"content": "look."},
    ]
    assert t.content_started
    assert fed(t, *CALLS) == []  # held
    assert t.shown_text() == PartialAnswer("Let me look.", "", "chatcmpl-1", 100, deltas=2)
    out = fed(t, FINISH, USAGE)
    assert [{k: c[k] for k in HEAD} for c in out] == [HEAD] * 3
    assert out[0]["choices"] == [
        {"index": 0, "delta": {"tool_calls": WHOLE}, "finish_reason": None}
    ]
    assert out[1]["choices"][0]["finish_reason"] == "tool_calls"
    assert out[2]["usage"] == {"prompt_tokens": 3}
    assert t.finished and t.shown_text() is None


def test_an_answer_of_tool_calls_alone_shows_nothing_until_its_finish() -> None:
    t = hold()
    assert deltas(fed(t, ROLE)) == [{"role": "assistant", "content": None}]
    assert not t.content_started and not t.generating
    assert fed(t, *CALLS) == []
    # the upstream began, the caller was shown nothing: a break here is sent again silently
    assert t.generating and not t.content_started
    out = fed(t, FINISH)
    assert deltas(out) == [{"tool_calls": WHOLE}, {}]
    assert t.content_started


def test_reasoning_then_a_call_keeps_the_reasoning_shown() -> None:
    t = hold()
    fed(t, ROLE, chunk({"reasoning_content": "Which file?"}), *CALLS[:2])
    assert t.content_started
    assert t.shown_text() == PartialAnswer("", "Which file?", "chatcmpl-1", 100, deltas=1)


def test_a_chunk_with_text_and_a_call_keeps_its_text() -> None:
    t = hold()
    both = {"content": "Reading.", **call_head(0, "call_a", "read")}
    assert deltas(fed(t, ROLE, chunk(both))) == [
        {"role": "assistant", "content": None},
        {"content": "Reading."},
    ]
    assert t.content_started


def test_a_call_without_arguments_gets_empty_ones() -> None:
    t = hold()
    fed(t, ROLE, chunk(call_head(0, "call_a", "now")))
    (call,) = deltas(fed(t, FINISH))[0]["tool_calls"]
    assert call["function"] == {"name": "now", "arguments": "{}"}


def test_an_end_with_no_finish_chunk_still_lets_the_calls_go() -> None:
    t = hold()
    fed(t, ROLE, *CALLS)
    out = fed(t, b"[DONE]")
    assert deltas(out) == [{"tool_calls": WHOLE}]


def test_a_continuation_starts_shown() -> None:
    inner = OpenAIStreamTranslator(STREAMED, continuing=PartialAnswer("Let me", ""))
    t = ToolCallHold(inner)
    assert t.content_started
    assert fed(t, chunk({"content": " look."}), *CALLS) == [
        {**HEAD, "choices": [{"index": 0, "delta": {"content": " look."}, "finish_reason": None}]}
    ]


@given(st.lists(st.integers(min_value=1, max_value=4), min_size=5, max_size=5))
def test_any_split_of_the_arguments_gives_the_same_whole_calls(sizes: list[int]) -> None:
    """However the upstream cuts a call's arguments into deltas, the caller gets them whole."""
    text = '{"path": "some/where.txt", "lines": [1, 2, 3]}'
    pieces, at = [], 0
    for n in sizes * 20:
        if at >= len(text):
            break
        pieces.append(text[at : at + n])
        at += n
    t = hold()
    fed(t, ROLE, chunk(call_head(0, "call_a", "read")), *(chunk(args(0, p)) for p in pieces))
    (call,) = deltas(fed(t, FINISH))[0]["tool_calls"]
    assert call["function"]["arguments"] == text
