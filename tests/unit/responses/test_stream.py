"""The stream translator: the events of each kind of chat chunk, in order, with sequence
numbers; the end, the failures and the discard; and the SDK's own stream state reading
every stream to the same ``Response`` a whole answer gives."""

from __future__ import annotations

import itertools
from typing import Any, cast

import orjson
from hypothesis import given
from hypothesis import strategies as st
from openai._models import construct_type
from openai._types import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from boundedcode_gateway.fronts.responses.response import Echo, Frame, from_chat_completion
from boundedcode_gateway.fronts.responses.sealed import open_reasoning
from boundedcode_gateway.fronts.responses.stream import ResponsesStream
from boundedcode_gateway.fronts.sealing import Sealer
from boundedcode_gateway.wire.chat import Stamps
from tests.responses_sdk import DISCARD_EVENT, check_stream

SEALER = Sealer(b"\x07" * 32, clock=lambda: 1_800_000_000.0)


def stamps() -> Stamps:
    counter = itertools.count(1)
    return Stamps(clock=lambda: 1_700_000_000.0, random_hex=lambda: f"{next(counter):04x}")


def translator() -> ResponsesStream:
    s = stamps()
    return ResponsesStream(Frame.new(Echo(model="local"), s), SEALER, s)


def data(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else orjson.dumps(obj)) + b"\n\n"


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return data({"id": "c", "object": "chat.completion.chunk", "choices": choices, **extra})


DONE = data(b"[DONE]")
USAGE = {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16}
ROLE = chunk({"role": "assistant", "content": None})
PROGRESS = chunk({"role": "assistant"}, prompt_progress={"total": 10, "cache": 0, "processed": 10})
ANSWER = [
    ROLE,
    PROGRESS,
    chunk({"reasoning_content": "Think"}),
    chunk({"reasoning_content": " more."}),
    chunk({"content": "Let me "}),
    chunk({"content": "look."}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "read", "arguments": ""},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"p":'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"a"}'}}]}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "ls", "arguments": "{}"},
                }
            ]
        }
    ),
    chunk({}, "tool_calls"),
    chunk(None, usage=USAGE),
    DONE,
]
# the same answer, whole
WHOLE = {
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "reasoning_content": "Think more.",
                "content": "Let me look.",
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "read", "arguments": '{"p":"a"}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "ls", "arguments": "{}"},
                    },
                ],
            },
        }
    ],
    "usage": USAGE,
}


def run(chunks: list[bytes], end: bool = True) -> tuple[bytes, list[dict[str, Any]]]:
    t = translator()
    raw = b"".join(t.feed(c) for c in chunks) + (t.end() if end else b"")
    return raw, check_stream(raw, discard=True)


def brief(event: dict[str, Any]) -> tuple[Any, ...]:
    """The event's type and what tells it apart from others of its type."""
    keys = ("output_index", "delta", "text", "arguments")
    return (event["type"], *(event[k] for k in keys if k in event))


def sdk_final(events: list[dict[str, Any]]) -> Any:
    """What the SDK's own stream helper makes of the events: its final response."""
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=[], text_format=omit)
    for event in events:
        state.handle_event(cast(Any, construct_type(type_=ResponseStreamEvent, value=event)))
    return state._completed_response


def unsealed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events with each seal (random each time) replaced by what it holds."""
    raw = orjson.dumps(events)
    for event in events:
        item = event.get("item") or {}
        if "encrypted_content" in item:
            sealed = item["encrypted_content"]
            raw = raw.replace(
                sealed.encode(), str(open_reasoning(SEALER, "local", sealed)).encode()
            )
    out: list[dict[str, Any]] = orjson.loads(raw)
    return out


def without_ids(response: dict[str, Any]) -> dict[str, Any]:
    """A response with what differs between two answers (ids, seals) taken out."""
    output = []
    for item in response["output"]:
        item = {k: v for k, v in item.items() if k != "id"}
        if "encrypted_content" in item:
            assert open_reasoning(SEALER, "local", item.pop("encrypted_content")) is not None
        output.append(item)
    return {**response, "id": None, "output": output}


def test_every_event_of_an_answer_in_order() -> None:
    _, events = run(ANSWER)
    assert [brief(e) for e in events] == [
        ("response.created",),
        ("response.in_progress",),
        ("response.output_item.added", 0),
        ("response.content_part.added", 0),
        ("response.reasoning_text.delta", 0, "Think"),
        ("response.reasoning_text.delta", 0, " more."),
        ("response.output_item.added", 1),
        ("response.content_part.added", 1),
        ("response.output_text.delta", 1, "Let me "),
        ("response.output_text.delta", 1, "look."),
        ("response.output_item.added", 2),
        ("response.function_call_arguments.delta", 2, '{"p":'),
        ("response.function_call_arguments.delta", 2, '"a"}'),
        ("response.output_item.added", 3),
        ("response.function_call_arguments.delta", 3, "{}"),
        ("response.reasoning_text.done", 0, "Think more."),
        ("response.content_part.done", 0),
        ("response.output_item.done", 0),
        ("response.output_text.done", 1, "Let me look."),
        ("response.content_part.done", 1),
        ("response.output_item.done", 1),
        ("response.function_call_arguments.done", 2, '{"p":"a"}'),
        ("response.output_item.done", 2),
        ("response.function_call_arguments.done", 3, "{}"),
        ("response.output_item.done", 3),
        ("response.completed",),
    ]
    added = events[10]["item"]
    assert (added["call_id"], added["name"], added["arguments"]) == ("call_a", "read", "")
    sealed = events[17]["item"]["encrypted_content"]
    assert open_reasoning(SEALER, "local", sealed) == "Think more."
    completed = events[-1]["response"]
    assert completed["usage"]["total_tokens"] == 16
    assert [i["id"] for i in completed["output"]] == [
        events[i]["item"]["id"] for i in (2, 6, 10, 13)
    ]


def test_the_stream_ends_in_the_response_a_whole_answer_gives() -> None:
    _, events = run(ANSWER)
    streamed = events[-1]["response"]
    s = stamps()
    whole = from_chat_completion(WHOLE, Frame.new(Echo(model="local"), s), SEALER, s)
    assert without_ids(streamed) == without_ids(whole)
    final = sdk_final(events)
    assert final is not None
    assert final.output_text == "Let me look."
    assert [o.type for o in final.output] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=60))
def test_any_split_of_the_bytes_gives_the_same_events(cuts: list[int]) -> None:
    whole = b"".join(ANSWER)
    pieces, at = [], 0
    for cut in cuts:
        pieces.append(whole[at : at + cut])
        at += cut
    pieces.append(whole[at:])
    assert unsealed(run([p for p in pieces if p])[1]) == unsealed(run(ANSWER)[1])


def test_a_cut_answer_ends_incomplete() -> None:
    _, events = run(
        [ROLE, chunk({"content": "Half"}), chunk({}, "length"), chunk(None, usage=USAGE), DONE]
    )
    last = events[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["status"] == "incomplete"
    assert events[-2]["item"]["status"] == "incomplete"


def test_an_error_in_the_stream_fails_the_response() -> None:
    error = {
        "error": {
            "message": "the upstream broke",
            "type": "server_error",
            "param": None,
            "code": "upstream_stream_broken",
        }
    }
    t = translator()
    raw = t.feed(ROLE + chunk({"content": "Partial"}) + data(error))
    # nothing follows the end, not even a [DONE] or the front's own end
    assert t.feed(chunk({"content": "more"}) + DONE) == b"" and t.end() == b""
    events = check_stream(raw)
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert (
        events[-2]["code"] == "upstream_stream_broken"
        and events[-2]["message"] == "the upstream broke"
    )
    failed = events[-1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {
        "code": "upstream_stream_broken",
        "message": "the upstream broke",
        "param": None,
        "type": "server_error",
    }
    assert failed["output"][0]["content"][0]["text"] == "Partial"
    assert failed["output"][0]["status"] == "incomplete"


def test_a_stream_without_its_end_fails() -> None:
    _, events = run([ROLE, chunk({"content": "Partial"})])
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert events[-1]["response"]["error"]["code"] == "upstream_stream_broken"


def test_an_end_sent_twice_and_progress_are_passed_by() -> None:
    _, events = run([ROLE, PROGRESS, chunk({"content": "Hi"}), chunk({}, "stop"), DONE, DONE])
    assert [e["type"] for e in events].count("response.completed") == 1
    assert events[-1]["type"] == "response.completed"


def test_a_discard_closes_what_was_shown_and_the_fresh_answer_follows() -> None:
    discard = data(
        {
            "object": "chat.completion.chunk",
            "choices": [],
            "boundedcode": {"event": "discard", "reason": "broke"},
        }
    )
    shown = [
        ROLE,
        chunk({"content": "Let me "}),
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_x", "function": {"name": "read", "arguments": '{"p'}}
                ]
            }
        ),
    ]
    _, events = run([*shown, discard, *ANSWER[2:]])
    types = [e["type"] for e in events]
    at = types.index(DISCARD_EVENT)
    dropped = [e["item"] for e in events[:at] if e["type"] == "response.output_item.done"]
    assert [i["status"] for i in dropped] == ["incomplete", "incomplete"]
    assert events[at]["item_ids"] == [i["id"] for i in dropped]
    assert events[at]["reason"] == "broke"
    # the fresh answer's items take the next output indices; the response lists only them
    fresh = [e["output_index"] for e in events[at:] if e["type"] == "response.output_item.added"]
    assert fresh == [2, 3, 4, 5]
    completed = events[-1]["response"]
    assert [i["id"] for i in completed["output"]] == [
        e["item"]["id"] for e in events[at:] if e["type"] == "response.output_item.added"
    ]
    final = sdk_final([e for e in events if e["type"] != DISCARD_EVENT])
    assert final is not None and final.output_text == "Let me look."


def test_a_tool_call_without_an_id_gets_one() -> None:
    _, events = run(
        [
            chunk({"tool_calls": [{"index": 0, "function": {"name": "f"}}]}),
            chunk({}, "tool_calls"),
            DONE,
        ]
    )
    call = events[-1]["response"]["output"][0]
    assert call["call_id"].startswith("call_") and call["arguments"] == ""


def test_a_refusal_streams_as_a_message_of_its_own() -> None:
    chunks = [
        ROLE,
        chunk({"refusal": "I can't "}),
        chunk({"refusal": "help."}),
        chunk({}, "stop"),
        DONE,
    ]
    _, events = run(chunks)
    assert [brief(e) for e in events][2:-1] == [
        ("response.output_item.added", 0),
        ("response.content_part.added", 0),
        ("response.refusal.delta", 0, "I can't "),
        ("response.refusal.delta", 0, "help."),
        ("response.refusal.done", 0),
        ("response.content_part.done", 0),
        ("response.output_item.done", 0),
    ]
    assert events[-4]["refusal"] == "I can't help."
    s = stamps()
    whole = {
        "choices": [
            {"finish_reason": "stop", "message": {"content": None, "refusal": "I can't help."}}
        ]
    }
    expected = from_chat_completion(whole, Frame.new(Echo(model="local"), s), SEALER, s)
    assert without_ids(events[-1]["response"]) == without_ids(expected)
    assert expected["output"][0]["content"] == [{"type": "refusal", "refusal": "I can't help."}]
