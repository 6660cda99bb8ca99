"""Golden cases: the relay's chat chunks in, Anthropic's stream events out
(fronts/messages/stream.py), every event read with the official SDK's types and
assembled by its stream helper; a streamed answer and the same answer whole give the
same message."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from boundedcode_gateway.fronts.messages.response import thinking_signature, to_message
from boundedcode_gateway.fronts.messages.stream import MessagesStream
from boundedcode_gateway.fronts.sealing import Sealer
from tests.unit.front_messages.events import assemble, parse_sse

SEALER = Sealer(b"\x07" * 32, clock=lambda: 1_800_000_000.0)
HEAD = {"id": "chatcmpl-s1", "object": "chat.completion.chunk", "created": 1, "model": "fake-model"}
USAGE = {
    "prompt_tokens": 50,
    "completion_tokens": 7,
    "prompt_tokens_details": {"cached_tokens": 40},
}


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return b"data: " + orjson.dumps({**HEAD, "choices": choices, **extra}) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def run(*pieces: bytes) -> bytes:
    stream = MessagesStream("local", SEALER.sign)
    return b"".join(stream.feed(p) for p in pieces) + stream.end()


def names(raw: bytes) -> list[str]:
    return [name for name, _ in parse_sse(raw)]


def test_thinking_text_and_tool_calls_in_order() -> None:
    out = run(
        chunk({"role": "assistant", "content": None}),
        chunk({"reasoning_content": "Think"}) + chunk({"reasoning_content": "ing."}),
        chunk({"content": "Let me"}),
        chunk({"content": " look."}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "ls", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "."}'}}]}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "pwd", "arguments": "{}"},
                    }
                ]
            }
        ),
        chunk({}, "tool_calls"),
        chunk(usage=USAGE),
        DONE,
    )
    events = parse_sse(out)
    assert [
        (n, d.get("index"), (d.get("delta") or d.get("content_block") or {}).get("type"))
        for n, d in events
    ] == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("content_block_start", 3, "tool_use"),
        ("content_block_delta", 3, "input_json_delta"),
        ("content_block_stop", 3, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert events[0][1]["message"]["id"] == "msg_s1"
    assert events[4][1]["delta"]["signature"] == thinking_signature(
        "local", "Thinking.", SEALER.sign
    )
    assert events[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {
            "input_tokens": 10,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 40,
            "output_tokens": 7,
        },
    }
    message = assemble(out)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert message.content[2].input == {"path": "."}  # type: ignore[union-attr]
    assert message.usage.input_tokens == 10 and message.usage.cache_read_input_tokens == 40


def test_an_error_in_the_stream_ends_it_in_anthropics_shape() -> None:
    error = {
        "error": {
            "message": "upstream overloaded",
            "type": "upstream_error",
            "code": "upstream_unavailable",
            "param": None,
        }
    }
    out = run(chunk({"content": "Hel"}), b"data: " + orjson.dumps(error) + b"\n\n", DONE)
    assert names(out) == ["message_start", "content_block_start", "content_block_delta", "error"]
    assert parse_sse(out)[-1][1] == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "upstream overloaded"},
    }


BROKEN = (
    b"data: "
    + orjson.dumps(
        {
            "error": {
                "message": "the upstream stream ended with no finish reason and no [DONE]",
                "type": "server_error",
                "param": None,
                "code": "upstream_stream_broken",
            }
        }
    )
    + b"\n\n"
)
CALL = {
    "index": 0,
    "id": "call_1",
    "type": "function",
    "function": {"name": "ls", "arguments": '{"path": "."}'},
}


def test_a_broken_stream_is_an_api_error_with_no_block_ended_before_it() -> None:
    """Claude Code 2.1.197 sends the request again when a stream fails inside an open
    block, and gives up once a block has ended: at each point of an answer (the relay
    holds tool calls until the finish), nothing has ended unless a thinking block came
    before the text."""
    points = {
        "inside text": [chunk({"content": "Let me"})],
        "after the last text, before the finish": [chunk({"content": "Done."})],
        "inside reasoning": [chunk({"reasoning_content": "Think"})],
        "after the finish, before the end": [chunk({"content": "Done."}), chunk({}, "stop")],
    }
    for point, before in points.items():
        out = run(chunk({"role": "assistant", "content": None}), *before, BROKEN)
        got = names(out)
        assert "content_block_stop" not in got, point
        assert got[-1] == "error", point
        assert parse_sse(out)[-1][1]["error"]["type"] == "api_error", point
    after_thinking = run(chunk({"reasoning_content": "Think."}), chunk({"content": "Let"}), BROKEN)
    assert names(after_thinking).count("content_block_stop") == 1  # the thinking block's
    # the text block ends when the calls come, and they come with the finish, in the
    # piece of the stream the relay writes for the upstream's finish
    calls = run(chunk({"content": "Let me look."}), chunk({"tool_calls": [CALL]}))
    assert names(calls)[-4:] == [
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "error",  # the test's stream stopped short here; the relay's never does
    ]


def test_the_last_block_stops_with_the_message_delta() -> None:
    stream = MessagesStream("local", SEALER.sign)
    before = stream.feed(chunk({"content": "Hi."}) + chunk({}, "stop") + chunk(usage=USAGE))
    assert "content_block_stop" not in names(before)  # the finish alone ends nothing
    assert names(stream.feed(DONE)) == ["content_block_stop", "message_delta", "message_stop"]


def test_an_overload_from_an_anthropic_upstream_stays_one() -> None:
    error = {"message": "Overloaded", "type": "server_error", "code": "overloaded_error"}
    out = run(chunk({"content": "Hel"}), b"data: " + orjson.dumps({"error": error}) + b"\n\n")
    assert parse_sse(out)[-1][1]["error"]["type"] == "overloaded_error"


def test_an_overflow_in_the_stream_is_prompt_is_too_long() -> None:
    error = {
        "error": {
            "message": "request (5000 tokens) exceeds the available context size (4096 "
            "tokens), try increasing it",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
            "param": "messages",
        }
    }
    out = run(b"data: " + orjson.dumps(error) + b"\n\n")
    assert parse_sse(out) == [
        (
            "error",
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 5000 tokens > 4096 maximum",
                },
            },
        )
    ]


def test_a_discard_chunk_ends_the_answer_in_an_error() -> None:
    discard = {**HEAD, "choices": [], "boundedcode": {"event": "discard", "reason": "broken"}}
    out = run(
        chunk({"content": "Hel"}),
        b"data: " + orjson.dumps(discard) + b"\n\n",
        chunk({"content": "Hello"}),
        DONE,
    )
    assert names(out) == ["message_start", "content_block_start", "content_block_delta", "error"]
    assert parse_sse(out)[-1][1]["error"]["type"] == "api_error"


def test_a_stream_that_stops_short_ends_in_an_error() -> None:
    out = run(chunk({"content": "Hel"}))
    assert names(out)[-1] == "error"


@given(st.integers(min_value=1, max_value=len(chunk({"content": "Hel"})) - 1))
def test_a_stream_cut_inside_its_first_event_ends_in_an_error(cut: int) -> None:
    stream = MessagesStream("local", SEALER.sign)
    out = stream.feed(chunk({"content": "Hel"})[:cut]) + stream.end()
    assert names(out) == ["error"]


def test_an_end_asked_for_before_anything_came_is_not_the_end() -> None:
    stream = MessagesStream("local", SEALER.sign)
    assert stream.end() == b""
    out = stream.feed(chunk({}, "stop") + DONE) + stream.end()
    assert names(out) == ["message_start", "message_delta", "message_stop"]


def test_interleaved_tool_calls_end_in_an_error_rather_than_a_lost_input() -> None:
    head = {"type": "function", "function": {"name": "a", "arguments": "{"}}
    out = run(
        chunk({"tool_calls": [{"index": 0, "id": "c0", **head}]}),
        chunk({"tool_calls": [{"index": 1, "id": "c1", **head}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}),
        DONE,
    )
    assert names(out)[-1] == "error"


def test_comments_and_events_split_anywhere_are_read() -> None:
    whole = (
        chunk({"content": "Hello"}) + b": ping\n\n" + chunk({}, "stop") + chunk(usage=USAGE) + DONE
    )
    pieces = [whole[i : i + 7] for i in range(0, len(whole), 7)]
    assert run(*pieces) == run(whole)
    assert names(run(whole)) == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_an_answer_without_content_still_has_its_message() -> None:
    out = run(chunk({"role": "assistant", "content": ""}), chunk({}, "length"), DONE)
    message = assemble(out)
    assert message.content == [] and message.stop_reason == "max_tokens"


# -- parity: the same answer streamed and whole

_TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
_CALL = st.tuples(
    st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
    st.dictionaries(
        st.from_regex(r"[a-z]{1,6}", fullmatch=True),
        st.integers(-(2**53), 2**53) | _TEXT,
        max_size=3,
    ),
)


@st.composite
def answers(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "reasoning": draw(st.none() | _TEXT),
        "content": draw(_TEXT),
        "calls": draw(st.lists(_CALL, max_size=3)),
        "finish": draw(st.sampled_from(["stop", "length", "tool_calls"])),
    }


def pieces(text: str) -> st.SearchStrategy[list[str]]:
    """``text`` cut in up to five non-empty pieces, anywhere."""
    cuts = st.sets(st.integers(1, max(len(text) - 1, 1)), max_size=4)

    def cut(at: set[int]) -> list[str]:
        bounds = [0, *sorted(c for c in at if c < len(text)), len(text)]
        return [text[a:b] for a, b in itertools.pairwise(bounds) if text[a:b]]

    return cuts.map(cut)


@settings(max_examples=150, deadline=None)
@given(answer=answers(), data=st.data())
def test_a_streamed_answer_is_the_whole_answer(answer: dict[str, Any], data: st.DataObject) -> None:
    draw = data.draw
    calls: list[dict[str, Any]] = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": n, "arguments": orjson.dumps(a).decode()},
        }
        for i, (n, a) in enumerate(answer["calls"])
    ]
    message: dict[str, Any] = {"role": "assistant", "content": answer["content"]}
    if answer["reasoning"] is not None:
        message["reasoning_content"] = answer["reasoning"]
    if calls:
        message["tool_calls"] = calls
    whole = {
        **HEAD,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": answer["finish"]}],
        "usage": USAGE,
    }
    stream = [chunk({"role": "assistant", "content": None})]
    for piece in draw(pieces(answer["reasoning"] or "")):
        stream.append(chunk({"reasoning_content": piece}))
    for piece in draw(pieces(answer["content"])):
        stream.append(chunk({"content": piece}))
    for i, call in enumerate(calls):
        arguments = draw(pieces(call["function"]["arguments"]))
        head = {
            "index": i,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": arguments[0]},
        }
        stream.append(chunk({"tool_calls": [head]}))
        stream.extend(
            chunk({"tool_calls": [{"index": i, "function": {"arguments": a}}]})
            for a in arguments[1:]
        )
    stream += [chunk({}, answer["finish"]), chunk(usage=USAGE), DONE]
    raw = b"".join(stream)
    cut = draw(st.integers(0, len(raw)))
    assert assemble(run(raw[:cut], raw[cut:])).model_dump() == assemble_whole(whole)


def assemble_whole(whole: dict[str, Any]) -> dict[str, Any]:
    from anthropic.types import Message

    return Message.model_validate(to_message(whole, "local", SEALER.sign)).model_dump()
