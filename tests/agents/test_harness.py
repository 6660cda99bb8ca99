"""The harness on its own, with a small agent of the test's making (a Python script that
calls the chat front and runs the tool calls itself): what a run collects, and a run
stopped at its time limit."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from tests.agents.harness import AgentCommand, RunContext, check_run, run_agent, verdict
from tests.agents.scripted_model import BreakPoint

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
