"""OpenHands' SDK (its default agent, LiteLLM's `openai/local` at the gateway's `/v1`) does a
two-tool-call task through the gateway's chat front, streaming, plainly and with the
upstream's stream broken once at each point of an answer; and with the SDK's default of
no streaming. The file is written, the conversation finishes, the gateway refused nothing."""

from __future__ import annotations

import pytest

from tests.agents.chat_agents import AGENTS
from tests.agents.conftest import AgentRuns
from tests.agents.harness import check_run
from tests.agents.scripted_model import BreakPoint

pytestmark = [pytest.mark.agents, pytest.mark.timeout(400)]


@pytest.mark.parametrize("point", list(BreakPoint), ids=lambda p: p.value)
@pytest.mark.parametrize("agent", ["openhands"])
def test_openhands_does_the_task_through_the_gateway(
    agent_runs: AgentRuns, agent: str, point: BreakPoint
) -> None:
    assert agent in AGENTS
    check_run(agent_runs.result(agent, point))


@pytest.mark.parametrize("point", [BreakPoint.NONE], ids=lambda p: p.value)
@pytest.mark.parametrize("agent", ["openhands-unstreamed"])
def test_openhands_unstreamed_does_the_task_through_the_gateway(
    agent_runs: AgentRuns, agent: str, point: BreakPoint
) -> None:
    assert agent in AGENTS
    check_run(agent_runs.result(agent, point))
