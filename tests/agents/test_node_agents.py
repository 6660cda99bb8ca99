"""Claude Code, Codex and qwen-code do a two-tool-call task through the gateway, set up as
docs/fronts.md says, plainly and with the upstream's stream broken once at each point of
an answer: the file is written, the agent ends well, and the gateway refused nothing."""

from __future__ import annotations

import pytest

from tests.agents.conftest import AgentRuns
from tests.agents.harness import check_run
from tests.agents.node_agents import AGENTS
from tests.agents.scripted_model import BreakPoint

pytestmark = [pytest.mark.agents, pytest.mark.timeout(400)]


@pytest.mark.parametrize("point", list(BreakPoint), ids=lambda p: p.value)
@pytest.mark.parametrize("agent", list(AGENTS))
def test_agent_does_the_task_through_the_gateway(
    agent_runs: AgentRuns, agent: str, point: BreakPoint
) -> None:
    check_run(agent_runs.result(agent, point))
