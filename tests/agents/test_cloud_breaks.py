"""Every agent with its stream broken once on a cloud upstream: the scripted model served to
the gateway as an `openai-compatible` API, whose broken stream the gateway does not
continue. Before any content the gateway sends the request again and the agent sees one
answer; after content the agent gets the failure its own API's client retries (chat: the
in-stream error of type `server_error`; Responses: `response.failed`; Messages: the
`error` event of type `api_error`), recorded once as `upstream_stream_broken`.

Where the agent retries, it does the task: the file, exit 0, "done", no refused call, the
broken call recorded once and the agent's retry a later call the model answers. Where the
agent does not (its own limits, `LIMITS`: qwen-code retries nothing; Claude Code 2.1.197
gives up once a thinking block has ended), the test pins what it does, so a new release
of it, or a change of the gateway's failure, shows here.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.agents import node_agents
from tests.agents.chat_agents import AGENTS as CHAT_AGENTS
from tests.agents.chat_agents import aider_problems
from tests.agents.conftest import AgentRuns
from tests.agents.harness import CLOUD, AgentRun, problems
from tests.agents.scripted_model import BreakPoint

pytestmark = [pytest.mark.agents, pytest.mark.timeout(400)]

# each agent once, streaming, as it is set up by default (aider: its own edit format)
AGENTS = [*node_agents.AGENTS, "opencode", "openhands", "aider"]
POINTS = [
    BreakPoint.BEFORE_CONTENT,
    BreakPoint.IN_REASONING,
    BreakPoint.IN_TEXT,
    BreakPoint.BETWEEN_BLOCKS,
    BreakPoint.IN_TOOL_ARGS,
    BreakPoint.AFTER_LAST_BLOCK,
]


@dataclass(frozen=True)
class Limit:
    """What an agent that does not survive a break does instead: its exit status and what
    it prints (stdout or stderr); it sends nothing after the failure."""

    why: str
    returncode: int
    prints: str


# Claude Code 2.1.197 resends a turn (without streaming) only while no content block has
# ended; the scripted answer's thinking block has ended at each of these points
CLAUDE_197_GIVES_UP = Limit(
    "retries nothing once a content block has ended", 1, "API Error: the upstream stream broke"
)
# qwen-code takes the Messages `error` event as the end of its session
QWEN_GIVES_UP = Limit(
    "retries no failed stream",
    1,
    '[API Error: {"type":"error","error":{"type":"api_error","message":"the upstream stream broke',
)
AFTER_THINKING = [
    BreakPoint.IN_TEXT,
    BreakPoint.BETWEEN_BLOCKS,
    BreakPoint.IN_TOOL_ARGS,
    BreakPoint.AFTER_LAST_BLOCK,
]
LIMITS: dict[tuple[str, BreakPoint], Limit] = {
    **{("claude-code-2.1.197", p): CLAUDE_197_GIVES_UP for p in AFTER_THINKING},
    **{("qwen-code", p): QWEN_GIVES_UP for p in POINTS if p is not BreakPoint.BEFORE_CONTENT},
}


def _cells(limits: bool) -> list[object]:
    """The cells, as parameters named `<agent>-<point>` (`own-limit-...` for a limit)."""
    prefix = "own-limit-" if limits else ""
    return [
        pytest.param(agent, point, id=f"{prefix}{agent}-{point.value}")
        for agent in AGENTS
        for point in POINTS
        # aider calls no tools: its answers have no tool call to break inside
        if not (agent == "aider" and point is BreakPoint.IN_TOOL_ARGS)
        and ((agent, point) in LIMITS) is limits
    ]


def _problems(run: AgentRun) -> list[str]:
    return aider_problems(run) if run.agent == "aider" else problems(run)


@pytest.mark.parametrize("upstream", [CLOUD])
@pytest.mark.parametrize(("agent", "point"), _cells(limits=False))
def test_agent_survives_a_broken_cloud_stream(
    agent_runs: AgentRuns, agent: str, point: BreakPoint, upstream: str
) -> None:
    assert agent in node_agents.AGENTS or agent in CHAT_AGENTS
    run = agent_runs.result(agent, point, CLOUD)
    found = _problems(run)
    assert not found, "; ".join(found) + "\n" + run.summary()


@pytest.mark.parametrize("upstream", [CLOUD])
@pytest.mark.parametrize(("agent", "point"), _cells(limits=True))
def test_agent_own_limit_on_a_broken_cloud_stream(
    agent_runs: AgentRuns, agent: str, point: BreakPoint, upstream: str
) -> None:
    """The agent's own limit, not the gateway's: the failure reached it once, in the form
    its API's client retries, and the agent ended as `LIMITS` says, sending nothing more."""
    limit = LIMITS[(agent, point)]
    run = agent_runs.result(agent, point, CLOUD)
    found: list[str] = []
    if run.model.broke is None:
        found.append("the stream was never broken")
    ends = [(c.get("status"), c.get("error_code"), c.get("retried")) for c in run.broken_calls]
    if ends != [("error", "upstream_stream_broken", False)]:
        found.append(f"the failure was not recorded once {ends}")
    elif run.calls[-1] is not run.broken_calls[0]:
        found.append("the agent sent more after the failure: it may survive it now")
    if run.refused:
        found.append(f"the gateway refused {len(run.refused)} calls")
    if run.returncode != limit.returncode:
        found.append(f"the agent exited {run.returncode}, not {limit.returncode}")
    if limit.prints not in run.stdout + "\n" + run.stderr:
        found.append(f"the agent did not print {limit.prints!r}")
    assert not found, f"{limit.why}: " + "; ".join(found) + "\n" + run.summary()
