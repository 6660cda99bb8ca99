"""The Responses front in front of every provider kind: whole and streamed answers, a
tool loop (Gemini's thought signatures and Anthropic's thinking blocks put back by the
store), and a stream that breaks after it was shown, with and without the discard
event declared."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types.responses import Response, ResponseCompletedEvent, ResponseFailedEvent

from tests.e2e.conftest import Gateway
from tests.e2e.every_kind import ANSWER, AWARE, CALLS, KINDS, Fakes, Kind, fakes, start_gateway_on
from tests.fakes.common import Reply
from tests.responses_sdk import DISCARD_EVENT, EVENT_CLASSES, check_response, check_stream

__all__ = ["fakes"]  # the module-scoped fixture

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris and Lyon?"}]
FAKE_OF = {
    "local": "llama",
    "other": "other",
    "gpt": "openai",
    "glm": "compat",
    "claude": "claude",
    "gem": "gemini",
    "thinker": "claude",
}


@pytest.fixture(scope="module")
def gateway(fakes: Fakes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data_dir = tmp_path_factory.mktemp("gw")
    thinker = {
        **fakes.profiles["claude"],
        "model": "claude-sonnet-4-5",
        "thinking": {"budget_tokens": 2048},
        "max_tokens": 8192,
    }
    models = {**fakes.profiles, "thinker": thinker}
    gw = start_gateway_on(data_dir, models)
    yield gw
    gw.stop()


@pytest.fixture(params=KINDS, ids=[k.profile for k in KINDS])
def kind(request: pytest.FixtureRequest, fakes: Fakes) -> Kind:
    fakes.reset()
    return request.param  # type: ignore[no-any-return]


def fake(fakes: Fakes, profile: str) -> Any:
    return getattr(fakes, FAKE_OF[profile])


def streamed(client: openai.OpenAI, **request: Any) -> list[Any]:
    events = list(client.responses.create(stream=True, **request))
    for event in events:
        assert type(event) is EVENT_CLASSES[event.type], event
    return events


def calls_of(response: Response) -> list[tuple[str, Any]]:
    return [
        (o.name, orjson.loads(o.arguments)) for o in response.output if o.type == "function_call"
    ]


def test_whole_and_streamed_answers(gateway: Gateway, fakes: Fakes, kind: Kind) -> None:
    fake(fakes, kind.profile).queue(Reply(content=ANSWER), Reply(content=ANSWER))
    client = gateway.client(task=f"text-{kind.profile}")
    whole = client.responses.create(model=kind.profile, input=ASK)
    events = streamed(client, model=kind.profile, input=ASK)
    last = events[-1]
    assert isinstance(last, ResponseCompletedEvent)
    for answer in (whole, last.response):
        check_response(answer.model_dump(mode="json"))
        assert answer.output_text == ANSWER
        assert answer.status == "completed" and answer.model == kind.profile
        assert answer.usage is not None and answer.usage.output_tokens > 0
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == ANSWER
    assert [c["front"] for c in gateway.calls()[-2:]] == ["responses", "responses"]


def test_a_tool_loop(gateway: Gateway, fakes: Fakes, kind: Kind) -> None:
    calls = [{"name": n, "arguments": a} for n, a in CALLS]
    fake(fakes, kind.profile).queue(Reply(content="", tool_calls=calls), Reply(content=ANSWER))
    client = gateway.client(task=f"loop-{kind.profile}")
    with client.responses.stream(model=kind.profile, input=ASK, tools=TOOLS) as stream:
        first = stream.get_final_response()
    assert calls_of(first) == CALLS
    items = [*ASK, *(o.model_dump(exclude_none=True) for o in first.output)]
    for out in first.output:
        if out.type == "function_call":
            items.append(
                {"type": "function_call_output", "call_id": out.call_id, "output": "sunny"}
            )
    # Gemini refuses a function-call step without its signature: the store puts it back
    second = client.responses.create(model=kind.profile, input=items, tools=TOOLS)
    assert second.output_text == ANSWER


def test_a_break_after_the_answer_showed_fails_the_response(
    gateway: Gateway, fakes: Fakes, kind: Kind
) -> None:
    kind.queue_text(fakes)
    events = streamed(gateway.client(), model=kind.profile, input=ASK, tools=TOOLS)
    if kind.continues_text:
        # llama.cpp went on from where it broke: one whole answer
        assert isinstance(events[-1], ResponseCompletedEvent)
        assert events[-1].response.output_text == ANSWER
        return
    failed = events[-1]
    assert isinstance(failed, ResponseFailedEvent)
    assert failed.response.error is not None
    assert failed.response.error.code == "upstream_stream_broken"  # type: ignore[comparison-overlap]
    assert failed.response.error.type == "server_error"
    assert [e.type for e in events].count("response.completed") == 0
    assert gateway.calls()[-1]["error_code"] == "upstream_stream_broken"


def test_a_break_inside_tool_calls_that_showed_nothing_is_answered_again(
    gateway: Gateway, fakes: Fakes, kind: Kind
) -> None:
    """The relay holds tool calls until the finish: nothing was shown, the answer is sent
    again and the caller gets it whole."""
    kind.queue_tools(fakes)
    events = streamed(gateway.client(), model=kind.profile, input=ASK, tools=TOOLS)
    assert isinstance(events[-1], ResponseCompletedEvent)
    assert calls_of(events[-1].response) == CALLS
    assert gateway.calls()[-1]["retried"] is True


def test_a_break_with_the_discard_declared_is_answered_again(
    gateway: Gateway, fakes: Fakes, kind: Kind
) -> None:
    kind.queue_text(fakes)
    body = {"model": kind.profile, "input": ASK, "tools": TOOLS, "stream": True}
    with httpx.Client(timeout=30) as http:
        reply = http.post(gateway.url + "/v1/responses", json=body, headers=AWARE)
    events = check_stream(reply.content, discard=True)
    discards = [e for e in events if e["type"] == DISCARD_EVENT]
    completed = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    texts = [c["text"] for i in completed["output"] if i["type"] == "message" for c in i["content"]]
    assert texts == [ANSWER]
    if kind.continues_text:
        assert not discards  # continued: nothing to take back
    else:
        assert len(discards) == 1
        dropped = set(discards[0]["item_ids"])
        assert dropped
        assert not dropped & {i["id"] for i in completed["output"]}
    # the SDK's stream helper passes the event by and ends with the fresh answer
    kind.queue_text(fakes)
    client = gateway.client()
    with client.responses.stream(
        model=kind.profile, input=ASK, tools=TOOLS, extra_headers=AWARE
    ) as stream:
        assert stream.get_final_response().output_text == ANSWER
    assert gateway.calls()[-1]["retried"] is True


@pytest.mark.parametrize("keep", [True, False], ids=["items_kept", "items_dropped"])
def test_anthropic_thinking_is_shown_and_put_back(
    gateway: Gateway, fakes: Fakes, keep: bool
) -> None:
    fakes.reset()
    calls = [{"name": n, "arguments": a} for n, a in CALLS]
    thought = "Both cities need a look."
    fakes.claude.queue(
        Reply(content="", reasoning_content=thought, tool_calls=calls), Reply(content=ANSWER)
    )
    client = gateway.client(task=f"thinker-{keep}")
    first = client.responses.create(model="thinker", input=ASK, tools=TOOLS)
    reasoning = first.output[0]
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == thought
    items = [*ASK]
    for out in first.output:
        if out.type != "reasoning" or keep:
            items.append(out.model_dump(exclude_none=True))
        if out.type == "function_call":
            items.append(
                {"type": "function_call_output", "call_id": out.call_id, "output": "sunny"}
            )
    # Anthropic refuses the turn unless its thinking block comes back byte for byte
    assert client.responses.create(model="thinker", input=items, tools=TOOLS).output_text == ANSWER
    sent = fakes.claude.requests.last.body["messages"]
    assistant = next(m for m in sent if m["role"] == "assistant")
    assert assistant["content"][0]["type"] == "thinking"
    assert assistant["content"][0]["thinking"] == thought
