"""A llama.cpp stream that breaks in a text answer is continued where it broke: every
caller sees one unbroken answer, and the call log says so."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply, parse_sse, tokenize
from tests.outcomes import outcomes

ASK: list[Any] = [{"role": "user", "content": "Tell me about the sea."}]
ANSWER = "The sea covers most of the planet and holds most of its water."
REASONING = "The user asks about the sea. Keep it to one sentence."
AWARE = {"X-BoundedCode-Stream-Discard": "1"}


def stream(
    gw: Gateway, headers: dict[str, str] | None = None, model: str = "local", **extra: Any
) -> list[Any]:
    body = {"model": model, "messages": ASK, "stream": True, **extra}
    resp = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert resp.status_code == 200
    return parse_sse(resp.content)


def chunks_of(events: list[Any]) -> list[dict[str, Any]]:
    return [e for e in events if isinstance(e, dict)]


def joined(events: list[Any], key: str) -> str:
    return "".join(
        c["choices"][0]["delta"].get(key) or "" for c in chunks_of(events) if c.get("choices")
    )


def posts(upstreams: Upstreams) -> list[dict[str, Any]]:
    return [r.body for r in upstreams.llama.requests if r.method == "POST"]


@pytest.mark.parametrize("headers", [None, AWARE], ids=["unaware", "aware"])
def test_a_text_answer_goes_on_where_it_broke(
    gateway: Gateway, upstreams: Upstreams, headers: dict[str, str] | None
) -> None:
    # two progress chunks, the role chunk, then four tokens: "The sea "
    upstreams.llama.queue(Reply(content=ANSWER, break_after_chunks=7), Reply(content=ANSWER))
    events = stream(gateway, headers)
    assert events[-1] == "[DONE]"
    assert joined(events, "content") == ANSWER  # the shown part, then only what follows
    chunks = chunks_of(events)
    assert not any("boundedcode" in c for c in chunks)
    assert len({c["id"] for c in chunks}) == 1  # one answer, one id
    assert len([c for c in chunks if c["choices"][0]["delta"].get("role")]) == 1
    assert len([c for c in chunks if c["choices"][0].get("finish_reason")]) == 1
    sent = posts(upstreams)
    assert len(sent) == 2
    assert sent[1]["messages"] == [*ASK, {"role": "assistant", "content": "The sea "}]
    assert sent[1]["continue_final_message"] is True
    assert sent[1]["add_generation_prompt"] is False
    call = gateway.calls()[0]
    assert call["status"] == "ok" and call["retried"] is True and call["attempts"] == 2
    assert outcomes(call["attempt_log"]) == [
        {"status": 502, "code": "upstream_stream_broken"},
        {"status": 200, "code": None},
    ]
    assert call["adjustments"] == {
        "continued_after_break": True,
        "continued_from": {"content_chars": len("The sea "), "reasoning_chars": 0},
    }
    # the server had the partial answer cached: only the last prompt token is evaluated
    assert call["evaluated_tokens"] == 1
    assert call["finish_reason"] == "stop"


def test_reasoning_that_broke_is_continued_as_reasoning(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    # two progress chunks, the role chunk, four tokens of reasoning: "The user "
    upstreams.llama.queue(
        Reply(reasoning_content=REASONING, content=ANSWER, break_after_chunks=7),
        Reply(reasoning_content=REASONING, content=ANSWER),
    )
    events = stream(gateway)
    assert joined(events, "reasoning_content") == REASONING
    assert joined(events, "content") == ANSWER
    partial = posts(upstreams)[1]["messages"][-1]
    assert partial == {"role": "assistant", "content": "", "reasoning_content": "The user "}
    call = gateway.calls()[0]
    assert call["adjustments"]["continued_from"] == {
        "content_chars": 0,
        "reasoning_chars": len("The user "),
    }


def test_content_after_reasoning_goes_on_with_both(gateway: Gateway, upstreams: Upstreams) -> None:
    reasoning_chunks = len(tokenize(REASONING))
    upstreams.llama.queue(
        Reply(
            reasoning_content=REASONING,
            content=ANSWER,
            break_after_chunks=3 + reasoning_chunks + 2,  # two tokens of content
        ),
        Reply(reasoning_content=REASONING, content=ANSWER),
    )
    events = stream(gateway)
    assert joined(events, "reasoning_content") == REASONING
    assert joined(events, "content") == ANSWER
    partial = posts(upstreams)[1]["messages"][-1]
    assert partial == {"role": "assistant", "content": "The ", "reasoning_content": REASONING}


def test_a_break_inside_a_tool_call_after_text_goes_on_from_the_text(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    """The relay holds tool calls back until the finish: the caller was shown the text,
    the server goes on from it, and the call comes whole in the continuation."""
    calls = [{"name": "read_file", "arguments": '{"path": "README.md"}'}]
    text = "Reading it."
    # progress, role, the text's tokens, the call's head and two pieces of its arguments
    upstreams.llama.queue(
        Reply(content=text, tool_calls=calls, break_after_chunks=3 + len(tokenize(text)) + 3),
        Reply(content=text, tool_calls=calls),
    )
    events = stream(gateway, tools=[{"type": "function", "function": {"name": "read_file"}}])
    assert events[-1] == "[DONE]" and joined(events, "content") == text
    deltas = [
        tc
        for c in chunks_of(events)
        if c.get("choices")
        for tc in c["choices"][0]["delta"].get("tool_calls") or ()
    ]
    assert len(deltas) == 1  # the call whole, in one delta
    assert deltas[0]["function"] == {"name": "read_file", "arguments": '{"path": "README.md"}'}
    assert posts(upstreams)[1]["messages"][-1] == {"role": "assistant", "content": text}
    call = gateway.calls()[0]
    assert call["adjustments"]["continued_after_break"] is True
    assert call["finish_reason"] == "tool_calls"


def test_a_break_inside_a_tool_call_that_showed_nothing_is_sent_again(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    calls = [{"name": "read_file", "arguments": '{"path": "README.md"}'}]
    upstreams.llama.queue(
        Reply(content="", tool_calls=calls, break_after_chunks=6),
        Reply(content="", tool_calls=calls),
    )
    events = stream(gateway)
    assert events[-1] == "[DONE]"
    assert len(posts(upstreams)) == 2 and "continue_final_message" not in posts(upstreams)[1]
    call = gateway.calls()[0]
    assert call["adjustments"] == {} and call["retried"] is True and call["status"] == "ok"


@pytest.mark.parametrize("headers", [None, AWARE], ids=["unaware", "aware"])
def test_a_continuation_that_breaks_falls_back(
    gateway: Gateway, upstreams: Upstreams, headers: dict[str, str] | None
) -> None:
    upstreams.llama.queue(
        Reply(content=ANSWER, break_after_chunks=7),
        Reply(content=ANSWER, break_after_chunks=6),  # progress, role, four more tokens
        Reply(content=ANSWER),
    )
    events = stream(gateway, headers)
    call = gateway.calls()[0]
    assert call["adjustments"]["continued_after_break"] is False
    if headers is None:
        assert events[-1]["error"]["code"] == "upstream_stream_broken"
        assert ANSWER.startswith(joined(events, "content"))
        assert call["status"] == "error" and len(posts(upstreams)) == 2
        return
    discard = [i for i, e in enumerate(events) if isinstance(e, dict) and "boundedcode" in e]
    assert len(discard) == 1 and events[-1] == "[DONE]"
    assert joined(events[discard[0] + 1 :], "content") == ANSWER
    assert call["status"] == "ok" and len(posts(upstreams)) == 3
    assert "continue_final_message" not in posts(upstreams)[2]


def test_a_continuation_the_server_refuses_falls_back(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    refusal = {"error": {"code": 400, "message": "no", "type": "invalid_request_error"}}
    upstreams.llama.queue(
        Reply(content=ANSWER, break_after_chunks=7),
        Reply(status=400, error_body=refusal),
        Reply(content=ANSWER),
    )
    events = stream(gateway, AWARE)
    assert events[-1] == "[DONE]"
    discard = [i for i, e in enumerate(events) if isinstance(e, dict) and "boundedcode" in e]
    assert joined(events[discard[0] + 1 :], "content") == ANSWER
    call = gateway.calls()[0]
    assert [a["status"] for a in call["attempt_log"]] == [502, 400, 200]
    assert call["adjustments"]["continued_after_break"] is False


def test_the_caller_asked_for_usage_and_progress(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.llama.queue(Reply(content=ANSWER, break_after_chunks=7), Reply(content=ANSWER))
    events = stream(gateway, stream_options={"include_usage": True}, return_progress=True)
    chunks = chunks_of(events)
    assert joined(events, "content") == ANSWER
    first_text = next(i for i, c in enumerate(chunks) if joined([c], "content"))
    # no prompt progress in the middle of the answer
    assert not any("prompt_progress" in c for c in chunks[first_text:])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert len({c["id"] for c in chunks}) == 1


def test_other_kinds_are_not_continued(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.openai.queue(Reply(content=ANSWER, break_after_chunks=5), Reply(content=ANSWER))
    events = stream(gateway, model="gpt")
    assert events[-1]["error"]["code"] == "upstream_stream_broken"
    assert gateway.calls()[0]["adjustments"] == {}


def test_capabilities_say_which_models_continue(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    profiles = {
        **upstreams.profiles,
        "bare": {"provider": "local", "external_url": upstreams.profiles["local"]["external_url"]},
    }
    gw = start_gateway(profiles)
    models = httpx.get(gw.url + "/v1/models", timeout=10).json()["data"]
    got = {m["id"]: m["capabilities"]["continue_after_break"] for m in models}
    assert got == {"local": True, "bare": True, "other": False, "gpt": False, "glm": False}
