"""The fake Anthropic API against the official SDK: its client parses the fake's answers
and streams, and the fake refuses what the real API refuses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
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


# --------------------------------------------------------------------------- API versions


def _client_for(url: str, version: str) -> anthropic.Anthropic:
    """The SDK sending ``version`` (its 2.x releases send 2026-10-21 on their own)."""
    return anthropic.Anthropic(
        base_url=url, api_key=KEY, max_retries=0, default_headers={"anthropic-version": version}
    )


def _plain(**extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
        **extra,
    }


def test_the_key_comes_as_x_api_key_or_as_a_bearer_token() -> None:
    fake = FakeAnthropic(api_key=KEY)
    with serve_in_thread(fake.app) as server, httpx.Client(base_url=server.url) as http:
        version = {"anthropic-version": "2026-10-21"}
        for headers, status in [
            ({"x-api-key": KEY}, 200),
            ({"authorization": f"Bearer {KEY}"}, 200),
            ({"x-api-key": "wrong", "authorization": f"Bearer {KEY}"}, 401),  # x-api-key wins
            ({"authorization": "Bearer wrong"}, 401),
        ]:
            answer = http.post("/v1/messages", json=_plain(), headers={**version, **headers})
            assert answer.status_code == status, headers


def test_the_version_is_required_and_must_be_one_the_api_serves() -> None:
    fake = FakeAnthropic(api_key=KEY)
    with serve_in_thread(fake.app) as server, httpx.Client(base_url=server.url) as http:
        missing = http.post("/v1/messages", json=_plain(), headers={"x-api-key": KEY})
        assert missing.json()["error"]["message"] == "anthropic-version: header is required"
        bad = http.post(
            "/v1/messages",
            json=_plain(),
            headers={"x-api-key": KEY, "anthropic-version": "2024-10-22"},
        )
        assert bad.status_code == 400
        assert bad.json()["error"] == {
            "type": "invalid_request_error",
            "message": 'anthropic-version: "2024-10-22" is not a valid version',
        }


@pytest.fixture
def newest() -> Iterator[tuple[FakeAnthropic, anthropic.Anthropic]]:
    """The fake, and the SDK sending 2026-10-21 whichever release of it is installed."""
    fake = FakeAnthropic(api_key=KEY)
    with serve_in_thread(fake.app) as server, _client_for(server.url, "2026-10-21") as client:
        yield fake, client


@pytest.mark.parametrize("field", ["temperature", "top_p", "top_k"])
def test_2026_10_21_refuses_sampling_even_at_its_default(
    newest: tuple[FakeAnthropic, anthropic.Anthropic], field: str
) -> None:
    server, client = newest
    default = {"temperature": 1, "top_p": 1, "top_k": 0}[field]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(**_plain(extra_body={field: default}))
    assert info.value.status_code == 400
    assert info.value.body["error"] == {  # type: ignore[index]
        "type": "invalid_request_error",
        "message": f"{field}: Extra inputs are not permitted",
    }
    assert server.requests.last.headers["anthropic-version"] == "2026-10-21"


def test_2026_10_21_refuses_an_assistant_document_and_user_citations(
    newest: tuple[FakeAnthropic, anthropic.Anthropic],
) -> None:
    _, client = newest
    document = {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "d"},
    }
    turns: list[Any] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [document]},
        {"role": "user", "content": "go on"},
    ]
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.1\.content\.0: `document`"):
        client.messages.create(**_plain(messages=turns))
    cited = {
        "type": "text",
        "text": "t",
        "citations": [
            {
                "type": "char_location",
                "cited_text": "d",
                "document_index": 0,
                "document_title": None,
                "start_char_index": 0,
                "end_char_index": 1,
            }
        ],
    }
    result = {
        "type": "search_result",
        "source": "s",
        "title": "t",
        "content": [cited],
    }
    for block in (cited, result):
        with pytest.raises(anthropic.BadRequestError, match=r"messages\.0\.content\.0\.citations"):
            client.messages.create(**_plain(messages=[{"role": "user", "content": [block]}]))
    # empty citations are no citations
    assert client.messages.create(
        **_plain(messages=[{"role": "user", "content": [{**cited, "citations": []}]}])
    ).content


def test_2023_06_01_takes_sampling_and_checks_it_by_hand() -> None:
    fake = FakeAnthropic(api_key=KEY)
    with serve_in_thread(fake.app) as server, _client_for(server.url, "2023-06-01") as client:
        sampled = {"temperature": 0.2, "top_p": 0.9, "top_k": 40}
        assert client.messages.create(**_plain(extra_body=sampled)).content
        assert fake.requests.last.body["top_k"] == 40
        for bad, message in [
            ({"temperature": 1.5}, "temperature: Input should be less than or equal to 1"),
            ({"top_p": -0.1}, "top_p: Input should be greater than or equal to 0"),
            ({"top_k": "40"}, "top_k: Input should be a valid integer"),
        ]:
            with pytest.raises(anthropic.BadRequestError, match=message):
                client.messages.create(**_plain(extra_body=bad))
        # a model that takes no sampling parameters, under the old version too
        fake.sampling_params = False
        with pytest.raises(anthropic.BadRequestError, match="`top_p` is deprecated"):
            client.messages.create(**_plain(extra_body={"top_p": 0.9}))
