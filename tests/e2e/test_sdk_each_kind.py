"""The openai SDK as the caller, against each of the four OpenAI-shaped upstream kinds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.e2e.conftest import COMPAT_KEY, OPENAI_KEY, Gateway, Upstreams
from tests.fakes.common import Reply

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
]
QUESTION: list[Any] = [{"role": "user", "content": "What is in README.md?"}]


@dataclass(frozen=True)
class Kind:
    profile: str
    fake: str
    upstream_model: str | None
    auth: str | None
    local: bool


KINDS = [
    Kind("local", "llama", "local", None, True),
    Kind("other", "other_local", "other", None, True),
    Kind("gpt", "openai", "gpt-5.1", f"Bearer {OPENAI_KEY}", False),
    Kind("glm", "compat", "glm-5", f"Bearer {COMPAT_KEY}", False),
]


def fake_of(ups: Upstreams, kind: Kind) -> Any:
    return getattr(ups, kind.fake)


@pytest.fixture(params=KINDS, ids=[k.profile for k in KINDS])
def kind(request: pytest.FixtureRequest) -> Kind:
    return request.param  # type: ignore[no-any-return]


def test_non_stream_text(gateway: Gateway, upstreams: Upstreams, kind: Kind) -> None:
    fake = fake_of(upstreams, kind)
    fake.queue(Reply(content="It describes the gateway."))
    reply = gateway.client().chat.completions.create(model=kind.profile, messages=QUESTION)
    assert reply.choices[0].message.content == "It describes the gateway."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    sent = fake.requests.last
    assert sent.body["model"] == kind.upstream_model
    assert sent.body["messages"] == QUESTION
    assert sent.header("authorization") == kind.auth
    assert (sent.header("idempotency-key") is not None) is kind.local
    assert "stream_options" not in sent.body


def test_stream_text_without_usage(gateway: Gateway, upstreams: Upstreams, kind: Kind) -> None:
    fake = fake_of(upstreams, kind)
    fake.queue(Reply(content="Streaming works fine here."))
    chunks = list(
        gateway.client().chat.completions.create(model=kind.profile, messages=QUESTION, stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Streaming works fine here."
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert all(c.usage is None for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    # the gateway asked for usage anyway, to meter the call
    assert fake.requests.last.body["stream_options"] == {"include_usage": True}


def test_stream_with_usage(gateway: Gateway, upstreams: Upstreams, kind: Kind) -> None:
    fake_of(upstreams, kind).queue(Reply(content="Counted."))
    chunks = list(
        gateway.client().chat.completions.create(
            model=kind.profile,
            messages=QUESTION,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert len({c.id for c in chunks}) == 1


def test_non_stream_tool_call(gateway: Gateway, upstreams: Upstreams, kind: Kind) -> None:
    fake = fake_of(upstreams, kind)
    fake.queue(
        Reply(content="", tool_calls=[{"name": "read_file", "arguments": '{"path": "README.md"}'}])
    )
    reply = gateway.client().chat.completions.create(
        model=kind.profile, messages=QUESTION, tools=TOOLS
    )
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls is not None and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.function.name == "read_file"  # type: ignore[union-attr]
    assert call.function.arguments == '{"path": "README.md"}'  # type: ignore[union-attr]
    assert call.id
    assert fake.requests.last.body["tools"] == TOOLS


def test_stream_tool_call_and_result_turn(
    gateway: Gateway, upstreams: Upstreams, kind: Kind
) -> None:
    fake = fake_of(upstreams, kind)
    fake.queue(
        Reply(content="", tool_calls=[{"name": "read_file", "arguments": '{"path": "README.md"}'}]),
        Reply(content="The README explains the gateway."),
    )
    client = gateway.client()
    chunks = list(
        client.chat.completions.create(
            model=kind.profile, messages=QUESTION, tools=TOOLS, stream=True
        )
    )
    calls: dict[int, dict[str, str]] = {}
    for c in chunks:
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += tc.id or ""
            slot["name"] += (tc.function.name or "") if tc.function else ""
            slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert list(calls) == [0]
    assert calls[0]["name"] == "read_file"
    assert calls[0]["arguments"] == '{"path": "README.md"}'
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    history: list[Any] = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": calls[0]["id"],
                    "type": "function",
                    "function": {"name": "read_file", "arguments": calls[0]["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "# BoundedCode gateway"},
    ]
    reply = client.chat.completions.create(model=kind.profile, messages=history, tools=TOOLS)
    assert reply.choices[0].message.content == "The README explains the gateway."
    assert fake.requests.last.body["messages"][2]["tool_call_id"] == calls[0]["id"]
