"""A Gemini 3 tool loop through the gateway, the caller keeping only OpenAI-shaped messages:
every turn passes the fake's signature check, also across a restart; another provider's or
profile's turns carry no signature of theirs."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import orjson
import yaml

from boundedcode_gateway.app import create_app
from boundedcode_gateway.config import parse_config
from tests.e2e.conftest import Gateway, GatewayFactory
from tests.e2e.gemini.conftest import GeminiSetup
from tests.fakes.common import Reply
from tests.fakes.gemini_api import MISSING_SIGNATURE, PLACEHOLDER
from tests.fakes.server import serve_in_thread

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for name in ("read_file", "list_dir")
]
SYSTEM = {"role": "system", "content": "You are a coding agent."}
LOOP = [
    # parallel calls: Gemini signs only the first
    Reply(
        content="",
        reasoning_content="Look at both.",
        tool_calls=[
            {"name": "read_file", "arguments": {"path": "a.py"}},
            {"name": "list_dir", "arguments": {"path": "."}},
        ],
    ),
    Reply(
        content="One more file.",
        reasoning_content="Need b.",
        tool_calls=[{"name": "read_file", "arguments": {"path": "b.py"}}],
    ),
    Reply(
        content="",
        tool_calls=[
            {"name": "list_dir", "arguments": {"path": "src"}},
            {"name": "read_file", "arguments": {"path": "src/c.py"}},
            {"name": "read_file", "arguments": {"path": "src/d.py"}},
        ],
    ),
    Reply(content="", tool_calls=[{"name": "read_file", "arguments": {"path": "e.py"}}]),
    Reply(content="The bug is in c.py, line 3.", reasoning_content="Found it."),
]


def as_caller_keeps(message: Any) -> dict[str, Any]:
    """The assistant message as an OpenAI-shaped history keeps it (no reasoning_content)."""
    kept: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        kept["tool_calls"] = [
            {"id": c.id, "type": "function", "function": c.function.model_dump()}
            for c in message.tool_calls
        ]
    return kept


def run_turns(
    client: openai.OpenAI, history: list[Any], turns: int, stream_every: int = 2
) -> list[Any]:
    """Run a tool loop; every other turn streams. Returns the history after it."""
    for turn in range(turns):
        kwargs: dict[str, Any] = {"model": "gem", "messages": history, "tools": TOOLS}
        if turn % stream_every == 1:
            message = _streamed(client, kwargs)
        else:
            message = client.chat.completions.create(**kwargs).choices[0].message
        history = [*history, as_caller_keeps(message)]
        for call in message.tool_calls or ():
            result = {"role": "tool", "tool_call_id": call.id, "content": f"{call.id} done"}
            history.append(result)
        if not message.tool_calls:
            history.append({"role": "user", "content": f"Thanks; now turn {turn + 2}."})
    return history


def _streamed(client: openai.OpenAI, kwargs: dict[str, Any]) -> Any:
    with client.chat.completions.stream(**kwargs) as stream:
        for _ in stream:
            pass
        return stream.get_final_completion().choices[0].message


def stored_lines(gw: Gateway, task: str, want: int = 5) -> int:
    """Lines of the task's signature file, once the background appender wrote them."""
    path = gw.data_dir / "tasks" / task / "gemini-signatures.jsonl"
    deadline = time.monotonic() + 5
    while True:
        n = len(path.read_text().splitlines()) if path.exists() else 0
        if n >= want or time.monotonic() > deadline:
            return n
        time.sleep(0.02)


def first_call_signatures(body: dict[str, Any]) -> list[str | None]:
    """The signature on the first functionCall part of each model content."""
    out = []
    for content in body["contents"]:
        calls = [p for p in content["parts"] if "functionCall" in p]
        if content["role"] == "model" and calls:
            out.append(calls[0].get("thoughtSignature"))
    return out


def test_five_turn_tool_loop_passes_the_signature_check(
    gem: GeminiSetup, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(gem.profiles)
    gem.gemini.queue(*LOOP)
    history = run_turns(gw.client(task="loop"), [SYSTEM, {"role": "user", "content": "Fix"}], 5)
    assert gem.gemini.refused == []
    assert "reasoning_content" not in orjson.dumps(history).decode()
    calls = gw.calls()
    assert [c["status"] for c in calls] == ["ok"] * 5
    assert all(c["adjustments"] == {} for c in calls)  # every signature came from the store
    assert [c["finish_reason"] for c in calls] == ["tool_calls"] * 4 + ["stop"]
    bodies = [r.body for r in gem.gemini.requests]
    # each request signs every earlier step with exactly what Gemini issued for it
    for body in bodies[1:]:
        sigs = first_call_signatures(body)
        assert sigs and all(s in gem.gemini.issued for s in sigs)
    # the second of parallel calls went back unsigned, as Gemini wrote it
    first_step = bodies[1]["contents"][1]["parts"]
    assert [("thoughtSignature" in p) for p in first_step] == [True, False]
    # no thought part and no reasoning text ever goes back
    assert all(not p.get("thought") for b in bodies for c in b["contents"] for p in c["parts"])
    # one line per answer, with all its tool-call ids (2, 1, 3, 1) or its text's key
    path = gw.data_dir / "tasks" / "loop" / "gemini-signatures.jsonl"
    assert stored_lines(gw, "loop") == 5
    keys = [orjson.loads(line)["keys"] for line in path.read_bytes().splitlines()]
    assert [len(k) for k in keys] == [2, 1, 3, 1, 1]


def test_the_fake_refuses_an_unsigned_step(gem: GeminiSetup, start_gateway: GatewayFactory) -> None:
    """The check the loop passes is real: a step Gemini signed, sent back bare, is a 400."""
    gw = start_gateway(gem.profiles)
    gem.gemini.queue(LOOP[3])
    client = gw.client(task="bare")
    ask: list[Any] = [{"role": "user", "content": "Go"}]
    message = client.chat.completions.create(model="gem", messages=ask, tools=TOOLS)
    history = [*ask, as_caller_keeps(message.choices[0].message)]
    call_id = history[-1]["tool_calls"][0]["id"]
    history.append({"role": "tool", "tool_call_id": call_id, "content": "x"})
    # a different task has no signatures: the gateway must use the placeholder
    gw.client(task="other").chat.completions.create(model="gem", messages=history, tools=TOOLS)
    assert first_call_signatures(gem.gemini.requests.last.body) == [PLACEHOLDER]
    assert gw.calls()[-1]["adjustments"] == {"signature_placeholders": 1}
    # the same body with the placeholder removed is refused with Gemini's words
    body = gem.gemini.requests.last.body
    for content in body["contents"]:
        for part in content["parts"]:
            part.pop("thoughtSignature", None)
    resp = httpx.post(
        gem.profiles["gem"]["base_url"] + "/models/gemini-3-pro-preview:generateContent",
        headers={"x-goog-api-key": "AIza-test-gemini-key-0123"},
        json=body,
        timeout=10,
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == MISSING_SIGNATURE.format(name="read_file", position=1)


def test_the_loop_survives_a_gateway_restart(
    gem: GeminiSetup, start_gateway: GatewayFactory
) -> None:
    first = start_gateway(gem.profiles)
    gem.gemini.queue(*LOOP)
    start = [SYSTEM, {"role": "user", "content": "Fix"}]
    history = run_turns(first.client(task="resume"), start, 3)
    first.stop()
    text = yaml.safe_dump({"data_dir": str(first.data_dir), "models": gem.profiles})
    app = create_app(parse_config(text))
    with serve_in_thread(app, lifespan="on") as server:
        second = Gateway(app, server, first.data_dir)
        run_turns(second.client(task="resume"), history, 2)
        calls = second.calls()[-2:]
        second.stop()
    assert gem.gemini.refused == []
    assert [c["status"] for c in calls] == ["ok", "ok"]
    assert all(c["adjustments"] == {} for c in calls)
    last = gem.gemini.requests.last.body
    assert all(s in gem.gemini.issued for s in first_call_signatures(last))


def test_another_providers_history_carries_no_foreign_signature(
    gem: GeminiSetup, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(gem.profiles)
    client = gw.client(task="mixed")
    history: list[Any] = [SYSTEM, {"role": "user", "content": "Fix"}]
    # a turn by OpenAI, another by the second Gemini profile
    gem.openai.queue(
        Reply(content="", tool_calls=[{"name": "read_file", "arguments": '{"path": "x"}'}])
    )
    message = client.chat.completions.create(model="gpt", messages=history, tools=TOOLS)
    history += [as_caller_keeps(message.choices[0].message)]
    history.append(
        {"role": "tool", "tool_call_id": history[-1]["tool_calls"][0]["id"], "content": "1"}
    )
    gem.gemini.queue(LOOP[3], Reply(content="Done."))
    message = client.chat.completions.create(model="gem2", messages=history, tools=TOOLS)
    history += [as_caller_keeps(message.choices[0].message)]
    history.append(
        {"role": "tool", "tool_call_id": history[-1]["tool_calls"][0]["id"], "content": "2"}
    )
    gem2_signature = first_call_signatures(gem.gemini.requests.last.body)
    client.chat.completions.create(model="gem", messages=history, tools=TOOLS)
    body = gem.gemini.requests.last.body
    signatures = [p.get("thoughtSignature") for c in body["contents"] for p in c["parts"]]
    # both steps are in the current turn: each gets the placeholder, neither a real signature
    assert [s for s in signatures if s is not None] == [PLACEHOLDER, PLACEHOLDER]
    assert gem2_signature == [PLACEHOLDER]  # gem2 had no signature for the OpenAI turn either
    assert gw.calls()[-1]["adjustments"] == {"signature_placeholders": 2}
    assert gem.gemini.refused == []


def test_older_turns_of_another_profile_get_nothing(
    gem: GeminiSetup, start_gateway: GatewayFactory
) -> None:
    """Outside the current turn nothing is validated, so a foreign step stays unsigned."""
    gw = start_gateway(gem.profiles)
    client = gw.client(task="old")
    gem.gemini.queue(LOOP[3], Reply(content="Read it."), Reply(content="Fine."))
    history: list[Any] = [{"role": "user", "content": "Go"}]
    message = client.chat.completions.create(model="gem2", messages=history, tools=TOOLS)
    history += [as_caller_keeps(message.choices[0].message)]
    history.append(
        {"role": "tool", "tool_call_id": history[-1]["tool_calls"][0]["id"], "content": "1"}
    )
    message = client.chat.completions.create(model="gem2", messages=history, tools=TOOLS)
    history += [as_caller_keeps(message.choices[0].message), {"role": "user", "content": "Next"}]
    client.chat.completions.create(model="gem", messages=history, tools=TOOLS)
    body = gem.gemini.requests.last.body
    assert all("thoughtSignature" not in p for c in body["contents"] for p in c["parts"])
    assert gw.calls()[-1]["adjustments"] == {}
