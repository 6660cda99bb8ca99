"""Reasoning in the history, against the fakes: restored for llama.cpp (the cache stays warm),
dropped where not taken, required on tool turns under `keep`, kept across a restart."""

from __future__ import annotations

from typing import Any

import openai
import pytest
import yaml

from boundedcode_gateway.app import create_app
from boundedcode_gateway.config import parse_config
from boundedcode_gateway.reasoning_store.store import ReasoningStore
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply
from tests.fakes.server import serve_in_thread

SYSTEM = {"role": "system", "content": "You are a coding agent. " * 10}


def bounded_conversation(
    gw: Gateway, model: str, turns: list[Reply], fake: Any, task: str
) -> list[dict[str, Any]]:
    """Run turns as OpenHands does: the reasoning of each answer is not sent back."""
    fake.queue(*turns)
    client = gw.client(task=task)
    history: list[Any] = [SYSTEM, {"role": "user", "content": "Start the work."}]
    for i in range(len(turns)):
        reply = client.chat.completions.create(model=model, messages=history)
        message = reply.choices[0].message
        sent: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            sent["tool_calls"] = [tc.model_dump() for tc in message.tool_calls]
            history += [
                sent,
                {
                    "role": "tool",
                    "tool_call_id": message.tool_calls[0].id,
                    "content": f"result {i}",
                },
            ]
        else:
            history += [sent, {"role": "user", "content": f"Continue with step {i + 2}."}]
    return [c for c in gw.calls() if c["task"] == task]


TURNS = [
    Reply(content="I will look at the parser.", reasoning_content="The bug is in parse. " * 8),
    Reply(
        content="",
        reasoning_content="Read the file first. " * 8,
        tool_calls=[{"name": "read_file", "arguments": '{"path": "parser.py"}'}],
    ),
    Reply(content="Found it.", reasoning_content="Line 12 is wrong. " * 8),
    Reply(content="Fixed.", reasoning_content="Now it parses. " * 8),
]


def test_restored_reasoning_keeps_the_cache(gateway: Gateway, upstreams: Upstreams) -> None:
    calls = bounded_conversation(gateway, "local", TURNS, upstreams.llama, "warm")
    sent = [r.body["messages"] for r in upstreams.llama.requests if r.method == "POST"]
    # every earlier answer went back with its own reasoning, byte for byte
    for messages in sent[1:]:
        for m in messages:
            if m["role"] == "assistant":
                assert m["reasoning_content"] in [t.reasoning_content for t in TURNS]
    # so every turn after the first evaluates only what is new
    for call in calls[1:]:
        assert call["evaluated_tokens"] < 40, calls
    # each item's line reaches its file in the background, after the answer
    store = gateway.app.reasoning
    assert isinstance(store, ReasoningStore)
    store.flush()
    items = (gateway.data_dir / "tasks" / "warm" / "local-replay.jsonl").read_text().splitlines()
    assert len(items) == 4


def test_drop_evaluates_each_previous_answer_again(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(upstreams.profiles, inference={"reasoning_history": "drop"})
    calls = bounded_conversation(gw, "local", TURNS, upstreams.llama, "cold")
    sent = [r.body["messages"] for r in upstreams.llama.requests if r.method == "POST"]
    assert all("reasoning_content" not in m for msgs in sent for m in msgs)
    for call in calls[1:]:
        assert call["evaluated_tokens"] > 40, calls


def test_restart_keeps_the_reasoning(upstreams: Upstreams, start_gateway: GatewayFactory) -> None:
    first = start_gateway(upstreams.profiles)
    bounded_conversation(first, "local", TURNS[:2], upstreams.llama, "resumed")
    history = [r.body["messages"] for r in upstreams.llama.requests if r.method == "POST"][-1]
    first.stop()
    # a new gateway on the same data folder
    text = yaml.safe_dump({"data_dir": str(first.data_dir), "models": upstreams.profiles})
    app = create_app(parse_config(text))
    with serve_in_thread(app, lifespan="on") as server:
        second = Gateway(app, server, first.data_dir)
        stripped: list[Any] = [
            {k: v for k, v in m.items() if k != "reasoning_content"} for m in history
        ]
        upstreams.llama.queue(Reply(content="Next.", reasoning_content="More thoughts."))
        second.client(task="resumed").chat.completions.create(model="local", messages=stripped)
        restored = upstreams.llama.requests.last.body["messages"]
        assert [m.get("reasoning_content") for m in restored if m["role"] == "assistant"] == [
            TURNS[0].reasoning_content
        ]
        second.stop()


def test_keep_sends_reasoning_on_tool_turns_to_a_deepseek_like_service(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    upstreams.compat.returns_reasoning_content = True
    upstreams.compat.requires_reasoning_on_tool_turns = True
    tool_turn = Reply(
        content="",
        reasoning_content="Need the file.",
        tool_calls=[{"name": "read_file", "arguments": "{}"}],
    )
    done = Reply(content="Done.", reasoning_content="All good.")
    gw = start_gateway(upstreams.profiles, inference={"reasoning_history": "keep"})
    calls = bounded_conversation(gw, "glm", [tool_turn, done, done], upstreams.compat, "ds")
    assert all(c["status"] == "ok" for c in calls)
    second = upstreams.compat.requests[1].body["messages"]
    assert second[2]["reasoning_content"] == "Need the file."
    # under auto the same service is not sent reasoning, and refuses the tool turn
    auto = start_gateway(upstreams.profiles)
    upstreams.compat.queue(tool_turn, done)
    client = auto.client(task="ds-auto")
    history: list[Any] = [{"role": "user", "content": "go"}]
    reply = client.chat.completions.create(model="glm", messages=history)
    call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
    history += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "data"},
    ]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="glm", messages=history)
