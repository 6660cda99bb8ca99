"""Going on with a partial answer on llama.cpp: the request (golden cases), the flags
that rule it out, and the translator that relays only what follows."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from boundedcode_gateway.llama_server.flags import server_flags_continue
from boundedcode_gateway.providers.base import PartialAnswer, RequestOptions
from boundedcode_gateway.providers.openai_compat.continuation import continuation_body
from boundedcode_gateway.providers.openai_compat.stream import OpenAIStreamTranslator

ASK = [{"role": "user", "content": "hi"}]
STREAMED = RequestOptions(stream=True, include_usage=False, return_progress=False)


def body_after(sent: dict[str, Any], partial: PartialAnswer) -> Any:
    out = continuation_body(orjson.dumps(sent), partial)
    return None if out is None else orjson.loads(out)


@pytest.mark.parametrize(
    ("partial", "message"),
    [
        (PartialAnswer("Hello the", ""), {"role": "assistant", "content": "Hello the"}),
        (
            PartialAnswer("", "Let me"),
            {"role": "assistant", "content": "", "reasoning_content": "Let me"},
        ),
        (
            PartialAnswer("So", "Done thinking."),
            {"role": "assistant", "content": "So", "reasoning_content": "Done thinking."},
        ),
    ],
)
def test_the_partial_answer_becomes_the_final_message(
    partial: PartialAnswer, message: dict[str, Any]
) -> None:
    sent = {"model": "m", "messages": ASK, "stream": True, "return_progress": True}
    assert body_after(sent, partial) == {
        "model": "m",
        "messages": [*ASK, message],
        "stream": True,
        "return_progress": True,
        "continue_final_message": True,
        "add_generation_prompt": False,
    }


def test_the_token_limit_counts_what_was_shown() -> None:
    sent = {"messages": ASK, "max_tokens": 100, "max_completion_tokens": 3, "n_predict": -1}
    out = body_after(sent, PartialAnswer("a b c", "", deltas=5))
    assert (out["max_tokens"], out["max_completion_tokens"], out["n_predict"]) == (95, 1, -1)


@pytest.mark.parametrize(
    "sent",
    [
        # the caller's own prefill would mix with the partial text
        {"messages": [*ASK, {"role": "assistant", "content": "Sure,"}]},
        {"messages": ASK, "n": 2},
    ],
)
def test_requests_that_are_not_continued(sent: dict[str, Any]) -> None:
    assert body_after(sent, PartialAnswer("x", "")) is None


@pytest.mark.parametrize(
    ("argv", "continues"),
    [
        ([], True),
        (["--metrics", "--jinja"], True),
        (["--no-jinja"], False),
        (["--skip-chat-parsing"], False),
        (["--no-jinja", "--jinja"], True),
        (["--skip-chat-parsing", "--no-skip-chat-parsing"], True),
    ],
)
def test_server_flags(argv: list[str], continues: bool) -> None:
    assert server_flags_continue(argv) is continues


def choice_chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-new",
            "created": 200,
            "model": "m",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
    )


def test_the_text_shown_is_kept_and_a_tool_call_is_no_part_of_it() -> None:
    # the relay holds tool calls back until the finish: the caller was shown the text
    t = OpenAIStreamTranslator(STREAMED, keep_shown=True)
    assert t.shown_text() is None
    t.feed("", choice_chunk({"role": "assistant", "content": None}))
    t.feed("", choice_chunk({"reasoning_content": "Think."}))
    t.feed("", choice_chunk({"content": "Hel"}))
    t.feed("", choice_chunk({"content": "lo"}))
    assert t.shown_text() == PartialAnswer("Hello", "Think.", "chatcmpl-new", 200, deltas=3)
    head = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f"}}
    t.feed("", choice_chunk({"tool_calls": [head]}))
    assert t.shown_text() == PartialAnswer("Hello", "Think.", "chatcmpl-new", 200, deltas=3)
    assert OpenAIStreamTranslator(STREAMED).shown_text() is None  # not kept unless asked


def test_a_continuation_relays_only_what_follows_as_the_same_answer() -> None:
    before = PartialAnswer("Hello", "", "chatcmpl-first", 100)
    options = RequestOptions(
        stream=True, include_usage=True, return_progress=True, capture_content=True
    )
    t = OpenAIStreamTranslator(options, continuing=before)
    assert t.content_started
    progress = {"total": 9, "cache": 8, "processed": 9, "time_ms": 1}
    opening = choice_chunk({"role": "assistant", "content": None}, prompt_progress=progress)
    assert t.feed("", opening) == ()
    assert t.feed("", choice_chunk({"role": "assistant", "content": None})) == ()
    out = [orjson.loads(p) for p in t.feed("", choice_chunk({"content": " world"}))]
    assert out[0]["id"] == "chatcmpl-first" and out[0]["created"] == 100
    assert out[0]["choices"][0]["delta"] == {"content": " world"}
    t.feed("", choice_chunk({}, "stop"))
    usage = orjson.dumps({"id": "chatcmpl-new", "choices": [], "usage": {"prompt_tokens": 9}})
    assert orjson.loads(t.feed("", usage)[0])["id"] == "chatcmpl-first"
    # the whole answer, for the schema check and the reasoning store
    assert t.metrics.answer_text == "Hello world"
