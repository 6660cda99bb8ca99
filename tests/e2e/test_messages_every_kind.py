"""The Messages front in front of every upstream kind (llama.cpp, another local server,
OpenAI, an OpenAI-compatible service, Anthropic, Gemini), with the official
``anthropic`` SDK as the caller: whole and streamed answers, a tool call and its
result, and a stream that breaks after content."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import orjson
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message

from tests.e2e.conftest import Gateway
from tests.e2e.every_kind import ANSWER, CALLS, KINDS, Fakes, Kind, fakes, start_gateway_on
from tests.fakes.common import Reply

__all__ = ["fakes"]  # the module-scoped fixture

TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris and Lyon?"}]


@pytest.fixture(scope="module")
def gateway(fakes: Fakes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data_dir = tmp_path_factory.mktemp("gw")
    gw = start_gateway_on(data_dir, fakes.profiles)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def client(gateway: Gateway) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0) as sdk:
        yield sdk


@pytest.fixture(params=KINDS, ids=[k.profile for k in KINDS])
def kind(request: pytest.FixtureRequest, fakes: Fakes) -> Kind:
    fakes.reset()
    return request.param  # type: ignore[no-any-return]


def fake_of(fakes: Fakes, kind: Kind) -> Any:
    by_profile = {
        "local": fakes.llama,
        "other": fakes.other,
        "gpt": fakes.openai,
        "glm": fakes.compat,
        "claude": fakes.claude,
        "gem": fakes.gemini,
    }
    return by_profile[kind.profile]


def test_a_whole_text_answer(
    client: anthropic.Anthropic, fakes: Fakes, kind: Kind, gateway: Gateway
) -> None:
    fake_of(fakes, kind).queue(Reply(content=ANSWER))
    message = client.messages.create(
        model=kind.profile, max_tokens=500, messages=ASK, system="Be brief."
    )
    assert [b.type for b in message.content][-1] == "text"
    assert message.content[-1].text == ANSWER  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    call = gateway.calls()[-1]
    assert (call["model_profile"], call["front"], call["status"]) == (
        kind.profile,
        "messages",
        "ok",
    )


def test_streamed_tool_calls_and_their_results(
    client: anthropic.Anthropic, fakes: Fakes, kind: Kind
) -> None:
    fake = fake_of(fakes, kind)
    calls = [{"name": n, "arguments": orjson.dumps(a).decode()} for n, a in CALLS]
    fake.queue(Reply(content="", tool_calls=calls), Reply(content=ANSWER))
    with client.messages.stream(
        model=kind.profile, max_tokens=500, messages=ASK, tools=TOOLS
    ) as stream:
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert [(u.name, u.input) for u in uses] == CALLS
    assert final.stop_reason == "tool_use"
    results = [
        {"type": "tool_result", "tool_use_id": u.id, "content": f"sunny in {u.input['city']}"}
        for u in uses
    ]
    history = [
        *ASK,
        {"role": "assistant", "content": [b.to_dict() for b in final.content]},
        {"role": "user", "content": results},
    ]
    answer = client.messages.create(
        model=kind.profile, max_tokens=500, messages=history, tools=TOOLS
    )
    assert answer.content[-1].text == ANSWER  # type: ignore[union-attr]
    # the results reached the upstream, each in its own API's form
    sent = orjson.dumps(fake.requests.last.body).decode()
    assert "sunny in Paris" in sent and "sunny in Lyon" in sent


def test_a_stream_that_breaks_after_content(
    client: anthropic.Anthropic, fakes: Fakes, kind: Kind, gateway: Gateway
) -> None:
    kind.queue_text(fakes)
    text = ""
    if kind.continues_text:
        # llama.cpp goes on with the text it was shown: one unbroken answer
        with client.messages.stream(model=kind.profile, max_tokens=500, messages=ASK) as stream:
            text = "".join(stream.text_stream)
        assert text == ANSWER
        return
    with (
        pytest.raises(anthropic.APIStatusError) as caught,
        client.messages.stream(model=kind.profile, max_tokens=500, messages=ASK) as stream,
    ):
        for piece in stream.text_stream:
            text += piece
    # what was shown stays a part of the one answer, never followed by a second
    assert text and ANSWER.startswith(text) and text != ANSWER
    assert caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert gateway.calls()[-1]["status"] == "error"


def test_every_event_is_one_the_sdk_reads(
    client: anthropic.Anthropic, fakes: Fakes, kind: Kind
) -> None:
    fake_of(fakes, kind).queue(
        Reply(content=ANSWER, reasoning_content="The user asks about the weather.")
    )
    events = list(
        client.messages.create(model=kind.profile, max_tokens=500, messages=ASK, stream=True)
    )
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    snapshot: Any = None
    json_bufs: dict[int, bytes] = {}
    for event in events:
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    message = Message.model_validate(snapshot.to_dict())
    assert message.content[-1].text == ANSWER  # type: ignore[union-attr]
