"""The fake Anthropic API against the official SDK: its client parses the fake's answers
and streams, and the fake refuses what the real API refuses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from tests.fakes.anthropic_api import AnthropicReply, FakeAnthropic, message_events
from tests.fakes.common import Reply
from tests.fakes.server import serve_in_thread

KEY = "sk-ant-fake"


@pytest.fixture
def fake() -> Iterator[tuple[FakeAnthropic, anthropic.Anthropic]]:
    fake = FakeAnthropic(api_key=KEY)
    with serve_in_thread(fake.app) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
        try:
            yield fake, client
        finally:
            client.close()


def _thinking_request(**extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "messages": [{"role": "user", "content": "hi"}],
        **extra,
    }


def test_the_sdk_reads_whole_answers_and_streams(
    fake: tuple[FakeAnthropic, anthropic.Anthropic],
) -> None:
    server, client = fake
    server.queue(AnthropicReply(content="Hello.", reasoning_content="Hmm.", redacted=True))
    message = client.messages.create(**_thinking_request())
    assert [b.type for b in message.content] == ["thinking", "redacted_thinking", "text"]
    server.queue(
        Reply(
            content="Calling.",
            reasoning_content="Plan.",
            tool_calls=[{"name": "ls", "arguments": {"a": 1}}],
        )
    )
    with client.messages.stream(**_thinking_request()) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[0].thinking == "Plan."  # type: ignore[union-attr]
    assert final.content[2].input == {"a": 1}  # type: ignore[union-attr]
    assert final.stop_reason == "tool_use"


def test_events_and_messages_match_the_sdk_types() -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [
            {"type": "thinking", "thinking": "t", "signature": "s"},
            {"type": "text", "text": "x"},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 2},
    }
    Message.model_validate(message)
    events = TypeAdapter(RawMessageStreamEvent)
    for name, data in message_events(message):
        if name != "ping":
            assert events.validate_python(data).type == name


def test_the_fake_enforces_the_thinking_rules(
    fake: tuple[FakeAnthropic, anthropic.Anthropic],
) -> None:
    server, client = fake
    server.queue(
        Reply(content="", reasoning_content="Plan.", tool_calls=[{"name": "ls", "arguments": {}}])
    )
    first = client.messages.create(**_thinking_request())
    tool_use = first.content[-1]
    history: list[Any] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [tool_use.model_dump()]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "r"}],
        },
    ]
    with pytest.raises(
        anthropic.BadRequestError, match="Expected `thinking` or `redacted_thinking`"
    ):
        client.messages.create(**_thinking_request(messages=history))
    altered = first.content[0].model_dump()
    altered["thinking"] += " "
    history[1]["content"] = [altered, tool_use.model_dump()]
    with pytest.raises(anthropic.BadRequestError, match="Invalid `signature` in `thinking` block"):
        client.messages.create(**_thinking_request(messages=history))
    history[1]["content"] = [first.content[0].model_dump(), tool_use.model_dump()]
    assert client.messages.create(**_thinking_request(messages=history)).content
    with pytest.raises(anthropic.BadRequestError, match="forces tool use"):
        client.messages.create(
            **_thinking_request(
                tools=[{"name": "ls", "input_schema": {"type": "object"}}],
                tool_choice={"type": "any"},
            )
        )


def test_the_fake_refuses_unknown_fields(fake: tuple[FakeAnthropic, anthropic.Anthropic]) -> None:
    _, client = fake
    with pytest.raises(anthropic.BadRequestError, match="frequency_penalty"):
        client.messages.create(**_thinking_request(extra_body={"frequency_penalty": 1}))
