"""The harness on its own, with a small agent of the test's making (a Python script that
calls the chat front and runs the tool calls itself): what a run collects, on either
upstream, a run stopped at its time limit, and how a break's records are judged."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.agents.harness import (
    CLOUD,
    LLAMA_CPP,
    AgentCommand,
    AgentRun,
    RunContext,
    Upstream,
    break_problems,
    check_run,
    run_agent,
    run_problems,
    verdict,
)
from tests.agents.scripted_model import Answer, Break, BreakPoint, ScriptedModel, Task

# an agent loop over the chat front: one write tool, one read tool, until a text answer
AGENT = textwrap.dedent(
    """
    import json, pathlib, sys, httpx
    url, prompt = sys.argv[1], sys.argv[2]
    def tool(name, **props):
        schema = {"type": "object", "properties": props, "required": list(props)}
        return {"type": "function", "function": {"name": name, "parameters": schema}}
    tools = [tool("write_file", path={"type": "string"}, content={"type": "string"}),
             tool("read_file", path={"type": "string"})]
    messages = [{"role": "user", "content": prompt}]
    for _ in range(5):
        body = {"model": "local", "messages": messages, "tools": tools}
        answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=30).json()
        message = answer["choices"][0]["message"]
        messages.append(message)
        if not message.get("tool_calls"):
            print(message["content"])
            sys.exit(0)
        for call in message["tool_calls"]:
            args = json.loads(call["function"]["arguments"])
            path = pathlib.Path(args["path"])
            if call["function"]["name"] == "write_file":
                path.write_text(args["content"])
                result = "written"
            else:
                result = path.read_text()
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    sys.exit(3)
    """
)


def script_agent(ctx: RunContext) -> AgentCommand:
    return AgentCommand([sys.executable, "-c", AGENT, ctx.gateway_url, ctx.prompt])


def test_a_run_collects_the_exit_the_output_the_file_and_the_records(tmp_path: Path) -> None:
    run = run_agent("script", script_agent, break_at=BreakPoint.NONE, root=tmp_path)
    check_run(run)
    assert verdict(run) == "pass"
    assert run.stdout.strip() == "done"
    assert [a.step for a in run.model.answers] == ["write", "read", "done"]
    assert [(c["front"], c["http_status"], c["stream"]) for c in run.calls] == [
        ("chat", 200, False)
    ] * 3
    assert "Application startup complete" in run.gateway_output


def test_a_run_past_its_time_is_stopped(tmp_path: Path) -> None:
    def sleeper(ctx: RunContext) -> AgentCommand:
        return AgentCommand([sys.executable, "-c", "import time; print('on it'); time.sleep(60)"])

    run = run_agent("sleeper", sleeper, break_at=BreakPoint.NONE, root=tmp_path, timeout_s=2)
    assert run.returncode is None and run.seconds < 30
    assert verdict(run) == "fail: the agent did not finish in time"


def test_a_cloud_run_serves_the_model_as_an_openai_compatible_api(tmp_path: Path) -> None:
    run = run_agent("script", script_agent, break_at=BreakPoint.NONE, root=tmp_path, upstream=CLOUD)
    check_run(run)
    assert run.upstream == CLOUD
    assert {(c["provider"], c["status"]) for c in run.calls} == {("openai-compatible", "ok")}


def _broken_run(upstream: Upstream, calls: list[dict[str, Any]], steps: list[str]) -> AgentRun:
    """A run whose first answer broke inside its text, with these records and answers."""
    model = ScriptedModel(BreakPoint.IN_TEXT)
    model.broke = Break(BreakPoint.IN_TEXT, "write", 30, 0)
    model.answers = [Answer(s, None, True, i == 0) for i, s in enumerate(steps)]
    task = Task("/w/hello.txt", "hi")
    return AgentRun(
        "a", BreakPoint.IN_TEXT, 0, "done", "", "hi", calls, model, task, "", 1.0, upstream
    )


FAILED: dict[str, Any] = {
    "status": "error",
    "error_code": "upstream_stream_broken",
    "retried": False,
}
BROKE: dict[str, Any] = {"attempt_log": [{"status": 502, "code": "upstream_stream_broken"}]}
OK: dict[str, Any] = {"status": "ok", "error_code": None, "retried": False, "attempt_log": []}
CARRIED: dict[str, Any] = {"status": "ok", "error_code": None, "retried": True}


def test_a_cloud_break_after_content_is_the_failure_then_the_agents_retry() -> None:
    steps = ["write", "write", "read", "done"]
    retried = [{**FAILED, **BROKE}, OK, OK, OK]
    assert break_problems(_broken_run(CLOUD, retried, steps)) == []
    # the gateway carried it through itself: right on llama.cpp, not what a cloud one does
    carried = [{**CARRIED, **BROKE}, OK, OK]
    assert break_problems(_broken_run(LLAMA_CPP, carried, steps[1:])) == []
    assert (
        "the failure was not recorded once"
        in break_problems(_broken_run(CLOUD, carried, steps[1:]))[0]
    )
    # the failure, and nothing after it
    assert break_problems(_broken_run(CLOUD, [{**FAILED, **BROKE}], ["write"])) == [
        "the agent did not retry the broken call"
    ]
    # two failures: a retry that broke too is not one broken call
    twice = [{**FAILED, **BROKE}, {**FAILED, **BROKE}, OK]
    assert break_problems(_broken_run(CLOUD, twice, steps)) != []


def test_every_run_is_judged_on_its_exit_its_refused_calls_and_its_break() -> None:
    steps = ["write", "write", "read", "done"]
    calls = [{**FAILED, **BROKE}, OK, OK, OK]
    assert run_problems(_broken_run(CLOUD, calls, steps)) == []
    exited = dataclasses.replace(_broken_run(CLOUD, calls, steps), returncode=1)
    assert run_problems(exited) == ["the agent exited 1"]
    refused = _broken_run(CLOUD, [*calls], steps)
    refused.calls.append({"status": "error", "http_status": 400, "error_code": "invalid_value"})
    assert run_problems(refused) == ["the gateway refused 1 calls (400 invalid_value)"]
    never = _broken_run(CLOUD, calls, steps)
    never.model.broke = None
    assert run_problems(never) == ["the stream was never broken"]
