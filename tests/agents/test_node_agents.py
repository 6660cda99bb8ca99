"""Claude Code, Codex and qwen-code do a two-tool-call task through the gateway, set up as
docs/fronts.md says, plainly and with the upstream's stream broken once at each point of
an answer: the file is written, the agent ends well, and the gateway refused nothing."""

from __future__ import annotations

import pytest

from tests.agents.conftest import AgentRuns
from tests.agents.harness import AgentRun
from tests.agents.node_agents import AGENTS
from tests.agents.scripted_model import BreakPoint

pytestmark = [pytest.mark.agents, pytest.mark.timeout(400)]


def check_run(run: AgentRun) -> None:
    """What every agent's run must show, whatever the agent and the break."""
    why = run.summary()
    assert run.returncode is not None, "the agent did not finish in time\n" + why
    if run.break_at is not BreakPoint.NONE:
        assert run.model.broke is not None, "the stream was never broken\n" + why
        assert run.model.broke.point is run.break_at
    assert not run.refused, "the gateway refused calls\n" + why
    assert run.returncode == 0, why
    assert run.file_text is not None and run.file_text.rstrip("\n") == run.task.text, why
    steps = [a.step for a in run.model.answers]
    # the write, then the read-back once the agent ran the write, then the closing text
    assert {"write", "read", "done"} <= set(steps), why
    assert "done" in run.stdout.lower(), why
    broken = run.broken_calls
    if run.break_at is BreakPoint.NONE:
        assert not broken, why
    else:
        # the break is in the record of the call it happened in, and the gateway got the
        # answer through (continued or sent again) within that same call
        assert len(broken) == 1, why
        assert broken[0]["retried"] is True and broken[0]["status"] == "ok", why


@pytest.mark.parametrize("point", list(BreakPoint), ids=lambda p: p.value)
@pytest.mark.parametrize("agent", list(AGENTS))
def test_agent_does_the_task_through_the_gateway(
    agent_runs: AgentRuns, agent: str, point: BreakPoint
) -> None:
    check_run(agent_runs.result(agent, point))
