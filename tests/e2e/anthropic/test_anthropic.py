"""End to end through the gateway to a fake Anthropic API, with the ``openai`` SDK as caller.

The caller keeps only OpenAI-shaped messages (no thinking, no reasoning); the
fake refuses what the real API refuses, so every turn that succeeds proves the
gateway put the right thinking blocks back.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.e2e.anthropic.conftest import ANTHROPIC_KEY, Claude
from tests.e2e.conftest import Gateway, GatewayFactory
from tests.fakes.anthropic_api import AnthropicReply
from tests.fakes.common import Reply

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def _as_history(message: Any) -> dict[str, Any]:
    """What a bounded-mode agent keeps of an answer: OpenAI fields, no reasoning."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in message.tool_calls
        ]
    return out


def _ask(client: openai.OpenAI, messages: list[Any], stream: bool) -> Any:
    """One turn, streamed or not; the assembled message either way."""
    if not stream:
        return client.chat.completions.create(model="claude", messages=messages, tools=TOOLS)
    with client.chat.completions.stream(model="claude", messages=messages, tools=TOOLS) as s:
        for _ in s:
            pass
        return s.get_final_completion()


def _tool_loop_turns(
    claude: Claude, start_gateway: GatewayFactory, turns: int, restart_after: int | None = None
) -> tuple[list[Any], Gateway]:
    gw = start_gateway(claude.profiles)
    client = gw.client(task="t-loop")
    messages: list[Any] = [{"role": "user", "content": "Read the three files and sum them."}]
    for turn in range(turns):
        last = turn == turns - 1
        claude.fake.queue(
            AnthropicReply(
                content="Done." if last else f"Reading file {turn}.",
                reasoning_content=f"Step {turn}: I need file {turn}.",
                redacted=turn == 1,
                tool_calls=None
                if last
                else [{"name": "read_file", "arguments": {"path": f"f{turn}.txt"}}],
            )
        )
        completion = _ask(client, messages, stream=turn % 2 == 1)
        message = completion.choices[0].message
        assert completion.choices[0].finish_reason == ("stop" if last else "tool_calls")
        messages.append(_as_history(message))
        if not last:
            call = message.tool_calls[0]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(turn + 1)})
        if restart_after is not None and turn + 1 == restart_after:
            gw.stop()
            gw = start_gateway(claude.profiles, data_dir=str(gw.data_dir))
            client = gw.client(task="t-loop")
    return messages, gw


def test_five_turn_tool_loop_with_thinking(claude: Claude, start_gateway: GatewayFactory) -> None:
    _tool_loop_turns(claude, start_gateway, turns=5)
    bodies = claude.fake.requests.bodies("/v1/messages")
    assert len(bodies) == 5
    last = bodies[-1]
    assert last["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assistant_turns = [m for m in last["messages"] if m["role"] == "assistant"]
    assert len(assistant_turns) == 4
    for n, turn in enumerate(assistant_turns):
        assert turn["content"][0]["type"] == "thinking"
        assert turn["content"][0]["thinking"] == f"Step {n}: I need file {n}."
    # the redacted block of turn 1 went back right after its thinking block
    assert assistant_turns[1]["content"][1]["type"] == "redacted_thinking"
    assert "reasoning_content" not in orjson.dumps(last).decode()


def test_tool_loop_survives_a_gateway_restart(
    claude: Claude, start_gateway: GatewayFactory
) -> None:
    _, gw = _tool_loop_turns(claude, start_gateway, turns=5, restart_after=3)
    assert len(claude.fake.requests) == 5
    gw.stop()  # the store's last lines are written at shutdown at the latest
    replay = gw.data_dir / "tasks" / "t-loop" / "anthropic-thinking.jsonl"
    lines = [orjson.loads(x) for x in replay.read_bytes().splitlines()]
    assert len(lines) == 5  # one line per answer (each keyed by its tool call, the last by text)
    assert {x["profile"] for x in lines} == {"claude"}


def test_without_the_store_anthropic_refuses_the_turn(
    claude: Claude, start_gateway: GatewayFactory
) -> None:
    """The fake enforces the rule: the same history under another task has no thinking."""
    gw = start_gateway(claude.profiles)
    client = gw.client(task="t-a")
    messages: list[Any] = [{"role": "user", "content": "read it"}]
    claude.fake.queue(Reply(tool_calls=[{"name": "read_file", "arguments": {"path": "a"}}]))
    first = client.chat.completions.create(model="claude", messages=messages, tools=TOOLS)
    calls = first.choices[0].message.tool_calls
    assert calls is not None
    call = calls[0]
    messages += [
        _as_history(first.choices[0].message),
        {"role": "tool", "tool_call_id": call.id, "content": "x"},
    ]
    with pytest.raises(openai.BadRequestError) as info:
        gw.client(task="t-other").chat.completions.create(
            model="claude", messages=messages, tools=TOOLS
        )
    assert "Expected `thinking` or `redacted_thinking`" in str(info.value)
    second = client.chat.completions.create(model="claude", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "ok"


def test_parallel_tool_calls(claude: Claude, start_gateway: GatewayFactory) -> None:
    gw = start_gateway(claude.profiles)
    client = gw.client(task="t-par")
    messages: list[Any] = [{"role": "user", "content": "read a and b"}]
    claude.fake.queue(
        Reply(
            content="",
            tool_calls=[
                {"name": "read_file", "arguments": {"path": "a"}},
                {"name": "read_file", "arguments": {"path": "b"}},
            ],
        )
    )
    answer = _ask(client, messages, stream=True).choices[0].message
    assert [orjson.loads(c.function.arguments) for c in answer.tool_calls] == [
        {"path": "a"},
        {"path": "b"},
    ]
    messages.append(_as_history(answer))
    for c in answer.tool_calls:
        messages.append({"role": "tool", "tool_call_id": c.id, "content": "data " + c.id})
    final = client.chat.completions.create(model="claude", messages=messages, tools=TOOLS)
    assert final.choices[0].message.content == "ok"
    sent = claude.fake.requests.bodies("/v1/messages")[-1]["messages"]
    results = sent[-1]["content"]
    assert [b["type"] for b in results] == ["tool_result", "tool_result"]  # one user turn


def test_another_profiles_turn_gets_no_thinking(
    claude: Claude, start_gateway: GatewayFactory
) -> None:
    """A turn written by another profile keeps its text and tool calls, never thinking."""
    gw = start_gateway(claude.profiles)
    client = gw.client(task="t-mix")
    claude.fake.queue(
        Reply(content="from haiku", tool_calls=[{"name": "read_file", "arguments": {}}])
    )
    messages: list[Any] = [{"role": "user", "content": "go"}]
    first = client.chat.completions.create(model="haiku", messages=messages, tools=TOOLS)
    calls = first.choices[0].message.tool_calls
    assert calls is not None
    call = calls[0]
    history = _as_history(first.choices[0].message)
    history["reasoning_content"] = "a foreign model's reasoning"
    messages += [history, {"role": "user", "content": "now you"}]
    answer = client.chat.completions.create(model="claude", messages=messages, tools=TOOLS)
    assert answer.choices[0].message.content == "ok"
    sent = claude.fake.requests.bodies("/v1/messages")[-1]
    turn = sent["messages"][1]
    assert [b["type"] for b in turn["content"]] == ["text", "tool_use"]
    assert turn["content"][1]["id"] == call.id
    assert "foreign" not in orjson.dumps(sent).decode()


def test_stream_chunks_usage_and_metering(claude: Claude, start_gateway: GatewayFactory) -> None:
    gw = start_gateway(claude.profiles)
    client = gw.client(task="t-stream")
    system = {"role": "system", "content": "You are a careful engineer. " * 50}
    messages: list[Any] = [system, {"role": "user", "content": "say hello"}]
    claude.fake.queue(Reply(content="Hello there, friend.", reasoning_content="Greet."))
    stream = client.chat.completions.create(
        model="claude", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello there, friend."
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "again"}]
    client.chat.completions.create(model="claude", messages=messages)
    calls = gw.calls()
    assert [c["status"] for c in calls] == ["ok", "ok"]
    assert calls[0]["provider"] == "anthropic" and calls[0]["stream"] is True
    assert calls[0]["cached_tokens"] == 0 and calls[1]["cached_tokens"] > 0
    assert calls[1]["prompt_tokens"] > calls[1]["cached_tokens"]
    assert calls[1]["adjustments"] == {"thinking_blocks_replayed": 1}
    assert len(gw.ledger_rows()) == 2


def test_prompt_too_long_is_context_length_exceeded(
    claude: Claude, start_gateway: GatewayFactory
) -> None:
    claude.fake.context_window = 50
    gw = start_gateway(claude.profiles)
    with pytest.raises(openai.BadRequestError) as info:
        gw.client().chat.completions.create(
            model="haiku", messages=[{"role": "user", "content": "word " * 200}]
        )
    assert info.value.code == "context_length_exceeded"
    assert "prompt is too long" in info.value.message
    assert gw.calls()[0]["error_code"] == "context_length_exceeded"


def test_other_errors_keep_the_upstream_status(
    claude: Claude, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway({"claude": claude.profile(api_key_env="WRONG_KEY_ENV")})
    import os

    os.environ["WRONG_KEY_ENV"] = "sk-ant-wrong"
    try:
        with pytest.raises(openai.AuthenticationError) as info:
            gw.client().chat.completions.create(
                model="claude", messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        del os.environ["WRONG_KEY_ENV"]
    assert info.value.status_code == 401
    assert info.value.body["type"] == "authentication_error"  # type: ignore[index]


def test_structured_output_and_its_rejection(claude: Claude, start_gateway: GatewayFactory) -> None:
    gw = start_gateway(claude.profiles)
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
    }
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    claude.fake.queue(Reply(content='{"answer": 4}'))
    out = gw.client().chat.completions.create(
        model="haiku", messages=[{"role": "user", "content": "2+2 as JSON"}], response_format=fmt
    )
    assert orjson.loads(out.choices[0].message.content or "") == {"answer": 4}
    sent = claude.fake.requests.bodies("/v1/messages")[-1]
    assert sent["output_config"]["format"]["type"] == "json_schema"
    claude.fake.reject_schema = True
    claude.fake.queue(Reply(content='{"answer": 4}'))
    gw.client().chat.completions.create(
        model="claude", messages=[{"role": "user", "content": "2+2 as JSON"}], response_format=fmt
    )
    calls = gw.calls()
    assert calls[0]["structured_output"] == "sent" and calls[0]["schema_valid"] is True
    assert calls[1]["structured_output"] == "dropped_after_rejection"
    assert "output_config" not in claude.fake.requests.bodies("/v1/messages")[-1]


def test_forced_tool_choice_is_relaxed_while_thinking(
    claude: Claude, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(claude.profiles)
    claude.fake.queue(
        Reply(content="", tool_calls=[{"name": "read_file", "arguments": {"path": "x"}}])
    )
    out = gw.client().chat.completions.create(
        model="claude",
        messages=[{"role": "user", "content": "read x"}],
        tools=TOOLS,
        tool_choice="required",
    )
    assert out.choices[0].message.tool_calls
    assert gw.calls()[0]["adjustments"] == {"tool_choice": "any→auto"}


def test_capabilities_are_documented_ones(claude: Claude, start_gateway: GatewayFactory) -> None:
    gw = start_gateway(claude.profiles)
    with httpx.Client(base_url=gw.url) as http:
        model = http.get("/v1/models/claude").json()
    caps = model["capabilities"]
    assert caps["reasoning_back"] is True and caps["structured_output"] is True
    assert caps["streaming"] is True and caps["prompt_progress"] is False
    assert caps["source"] == "documentation"
    assert caps["continue_after_break"] is False


def test_a_missing_key_is_a_clear_error(claude: Claude, start_gateway: GatewayFactory) -> None:
    gw = start_gateway({"claude": claude.profile(api_key_env="NO_SUCH_KEY_SET")})
    with pytest.raises(openai.InternalServerError) as info:
        gw.client().chat.completions.create(
            model="claude", messages=[{"role": "user", "content": "hi"}]
        )
    assert "NO_SUCH_KEY_SET" in str(info.value)
    assert gw.calls()[0]["error_code"] == "missing_api_key"


def test_streamed_and_whole_answers_agree(claude: Claude, start_gateway: GatewayFactory) -> None:
    gw = start_gateway(claude.profiles)
    client = gw.client(task="t-parity")
    messages: list[Any] = [{"role": "user", "content": "read two"}]
    reply = Reply(
        content="Reading both, then I will sum them.",
        reasoning_content="Two reads are needed.",
        tool_calls=[
            {"name": "read_file", "arguments": {"path": "a b", "lines": [1, 2]}},
            {"name": "read_file", "arguments": {}},
        ],
    )
    claude.fake.queue(reply, reply)
    whole = _ask(client, messages, stream=False).choices[0].message
    streamed = _ask(client, messages, stream=True).choices[0].message
    assert streamed.content == whole.content
    assert [(c.function.name, orjson.loads(c.function.arguments)) for c in streamed.tool_calls] == [
        (c.function.name, orjson.loads(c.function.arguments)) for c in whole.tool_calls
    ]
    assert getattr(whole, "reasoning_content", None) == "Two reads are needed."
    assert getattr(streamed, "reasoning_content", None) == "Two reads are needed."


def test_a_model_that_refuses_sampling_gets_none_from_then_on(
    claude: Claude, start_gateway: GatewayFactory
) -> None:
    claude.fake.sampling_params = False
    gw = start_gateway({"haiku": claude.profile(anthropic_version="2023-06-01")})
    client = gw.client()
    for _ in range(2):
        out = client.chat.completions.create(
            model="haiku", messages=[{"role": "user", "content": "hi"}], temperature=0.2, top_p=0.9
        )
        assert out.choices[0].message.content == "ok"
    first, second = gw.calls()
    assert [a["status"] for a in first["attempt_log"]] == [400, 200]
    assert [a["status"] for a in second["attempt_log"]] == [200]
    assert second["adjustments"] == {"sampling_dropped": ["temperature", "top_p"]}
    assert "temperature" not in claude.fake.requests.bodies("/v1/messages")[-1]


def test_the_newest_version_is_sent_and_what_it_removed_is_dropped_with_a_note(
    claude: Claude, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(claude.profiles)
    out = gw.client().chat.completions.create(
        model="haiku",
        messages=[{"role": "user", "content": "hi"}],
        temperature=0,
        top_p=1,
        stop=["END"],
    )
    assert out.choices[0].message.content == "ok"
    sent = claude.fake.requests.last
    assert sent.headers["anthropic-version"] == "2026-10-21"
    # the upstream key stays an API key under the new version, never a bearer token
    assert sent.headers["x-api-key"] == ANTHROPIC_KEY and "authorization" not in sent.headers
    assert {"temperature", "top_p"}.isdisjoint(sent.body)
    assert sent.body["stop_sequences"] == ["END"]
    (call,) = gw.calls()
    assert [a["status"] for a in call["attempt_log"]] == [200]  # not refused first
    assert call["adjustments"] == {
        "dropped_for_api_version": {"version": "2026-10-21", "fields": ["temperature", "top_p"]}
    }


def test_a_profile_pinned_to_2023_06_01_sends_sampling_as_before(
    claude: Claude, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway({"haiku": claude.profile(anthropic_version="2023-06-01")})
    client = gw.client()
    for stream in (False, True):
        asked: dict[str, Any] = {"model": "haiku", "temperature": 0.3, "top_p": 0.8}
        messages: list[Any] = [{"role": "user", "content": "hi"}]
        if stream:
            chunks = client.chat.completions.create(messages=messages, stream=True, **asked)
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ok"
        else:
            whole = client.chat.completions.create(messages=messages, **asked)
            assert whole.choices[0].message.content == "ok"
        sent = claude.fake.requests.last
        assert sent.headers["anthropic-version"] == "2023-06-01"
        assert (sent.body["temperature"], sent.body["top_p"]) == (0.3, 0.8)
    assert all(call["adjustments"] == {} for call in gw.calls())
