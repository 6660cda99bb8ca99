"""The agents' runs, a few at once: every (agent, break point, upstream) case the session
collected is started in a bounded pool at the first test that asks for one, so the runs
overlap while the tests read their results in order.

A test parametrised with `agent` (a name registered in harness.LAUNCHERS), `point` (a
BreakPoint) and, where it is not llama.cpp, `upstream` (harness.Upstream) calls
`agent_runs.result(agent, point, upstream)`. `AGENT_RUNS_AT_ONCE` (default 3) bounds
the runs in flight; `AGENT_RUN_TIMEOUT_S` (default 90) bounds each agent's process. Each
run's outcome is also written to test-artifacts/agents/<agent>[-cloud]-<point>.json (or under
`AGENTS_ARTIFACTS`); `python -m tests.agents.matrix` prints them as a table.
`AGENTS_GATEWAY_SRC` runs another tree's gateway (its `src`) instead of this one's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.agents.harness import (
    LAUNCHERS,
    LLAMA_CPP,
    REPO,
    AgentRun,
    Upstream,
    case_name,
    dump,
    run_agent,
)
from tests.agents.scripted_model import BreakPoint

Case = tuple[str, BreakPoint, Upstream]
ARTIFACTS = Path(os.environ.get("AGENTS_ARTIFACTS") or REPO / "test-artifacts" / "agents")


class AgentRuns:
    """The session's cases, run in a pool; `result` waits for one."""

    def __init__(self, cases: list[Case], root: Path, workers: int, timeout_s: float) -> None:
        self._cases = cases
        self._root = root
        self._timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agent-run")
        self._futures: dict[Case, Future[AgentRun]] = {}
        self._lock = threading.Lock()

    def _run(self, case: Case) -> AgentRun:
        agent, point, upstream = case
        launch = LAUNCHERS[agent]()  # fails here, naming the install, when it is missing
        name = case_name(*case)
        run = run_agent(
            agent,
            launch,
            break_at=point,
            root=self._root / name,
            timeout_s=self._timeout_s,
            upstream=upstream,
        )
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        dump(run, ARTIFACTS / f"{name}.json")
        return run

    def _submit(self, case: Case) -> None:
        if case not in self._futures:
            self._futures[case] = self._pool.submit(self._run, case)

    def result(self, agent: str, point: BreakPoint, upstream: Upstream = LLAMA_CPP) -> AgentRun:
        assert agent in LAUNCHERS, f"no agent {agent!r} is registered: {sorted(LAUNCHERS)}"
        with self._lock:
            for case in self._cases:  # all of them, in the order the tests will ask
                self._submit(case)
            self._submit((agent, point, upstream))
        return self._futures[(agent, point, upstream)].result()

    def close(self) -> None:
        for future in self._futures.values():
            future.cancel()
        self._pool.shutdown(wait=True)


def _collected_cases(session: pytest.Session) -> list[Case]:
    cases: list[Case] = []
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        agent, point = params.get("agent"), params.get("point")
        upstream = params.get("upstream", LLAMA_CPP)
        if isinstance(agent, str) and isinstance(point, BreakPoint):
            case = (agent, point, upstream)
            if case not in cases:
                cases.append(case)
    return cases


@pytest.fixture(scope="session")
def agent_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentRuns]:
    runs = AgentRuns(
        _collected_cases(request.session),
        tmp_path_factory.mktemp("agent-runs"),
        workers=int(os.environ.get("AGENT_RUNS_AT_ONCE", "3")),
        timeout_s=float(os.environ.get("AGENT_RUN_TIMEOUT_S", "90")),
    )
    yield runs
    runs.close()
