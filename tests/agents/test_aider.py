"""aider does the task through the gateway's chat front, set up as for any OpenAI-compatible
server (`--openai-api-base`, `--model openai/local`), plainly and with the upstream's stream
broken once at each point its answer has; and the scripted model's answers are edits that
aider's own coders apply, in every edit format that creates a file.

aider calls no tools: its flow is the edit, written in the format its system prompt asks
for (tests/agents/aider_format.py), then, in a git repository, the commit message for it.
Its answer is reasoning and text, so every break point but a tool call's arguments exists
in it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.agents.aider_format import EditFormat, aider_text, edit_format_of, file_creation
from tests.agents.chat_agents import AGENTS, VENVS, aider_problems
from tests.agents.conftest import AgentRuns
from tests.agents.harness import INSTALL_HINT, REPO, AgentRun
from tests.agents.scripted_model import BreakPoint, Task

pytestmark = [pytest.mark.agents, pytest.mark.timeout(400)]

AIDER_CODERS = REPO / "tests" / "agents" / "aider_coders.py"
# every break point an answer of reasoning and text has
TEXT_POINTS = [p for p in BreakPoint if p is not BreakPoint.IN_TOOL_ARGS]
# aider 0.86's patch coder makes a new file empty before it applies the edit, then refuses
# its own `*** Add File` with "ADD Error: File already exists"
PATCH_CANNOT_ADD = pytest.mark.xfail(
    reason="aider's patch coder refuses to add a file it created empty itself", strict=True
)
FORMATS = [
    pytest.param(f, marks=PATCH_CANNOT_ADD) if f is EditFormat.PATCH else f for f in EditFormat
]
# what each format's request reads as: editor-diff-fenced asks in diff-fenced's words
READ_AS = {EditFormat.EDITOR_DIFF_FENCED: EditFormat.DIFF_FENCED}


# ------------------------------------------------------------------- the answers, golden


def test_a_whole_file_listing_names_the_file_before_the_fence() -> None:
    answer = file_creation(EditFormat.WHOLE, Task("a/b.txt", "hi there"))
    assert answer == "I will create a/b.txt with the text.\n\na/b.txt\n```\nhi there\n```\n"


def test_a_search_replace_block_creates_with_an_empty_search() -> None:
    answer = file_creation(EditFormat.DIFF, Task("b.txt", "hi"), ("````", "````"))
    block = "b.txt\n````text\n<<<<<<< SEARCH\n=======\nhi\n>>>>>>> REPLACE\n````\n"
    assert answer == "I will create b.txt with the text.\n\n" + block
    editor = file_creation(EditFormat.EDITOR_DIFF_FENCED, Task("b.txt", "hi"))
    assert editor == "```text\nb.txt\n<<<<<<< SEARCH\n=======\nhi\n>>>>>>> REPLACE\n```\n"


def test_a_unified_diff_and_a_patch_start_from_nothing() -> None:
    udiff = file_creation(EditFormat.UDIFF, Task("c.txt", "hi"), ("<source>", "</source>"))
    assert udiff.endswith("```diff\n--- /dev/null\n+++ c.txt\n@@ ... @@\n+hi\n```\n")
    patch = file_creation(EditFormat.PATCH, Task("c.txt", "hi"))
    assert patch == "*** Begin Patch\n*** Add File: c.txt\n+hi\n*** End Patch\n"


def test_requests_that_are_not_aiders_edits_pass() -> None:
    plain = {"messages": [{"role": "user", "content": "Create the file x containing exactly"}]}
    assert edit_format_of(plain) is None
    assert aider_text(plain) is None
    commit = {
        "messages": [
            {"role": "system", "content": "You generate concise, one-line Git commit messages"},
            {"role": "user", "content": "diff --git a/x.txt b/x.txt\n+++ b/x.txt\n@@ -0,0 +1 @@"},
        ]
    }
    assert aider_text(commit) == "feat: Add x.txt"


# ------------------------------------------------------------ the answers, by aider itself


def _aider_coders(home: Path, *args: str, stdin: str | None = None) -> Any:
    python = VENVS / "aider" / "bin" / "python"
    if not python.is_file():
        raise AssertionError(f"aider is not installed at {python}: {INSTALL_HINT}")
    done = subprocess.run(
        [str(python), str(AIDER_CODERS), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        },
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def aider_applied(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """For each format: the request aider makes, and what its coder did with the answer."""
    home = tmp_path_factory.mktemp("aider-home")
    names = [f.value for f in EditFormat]
    requests = _aider_coders(home, "prompts", *names)
    answers = {name: aider_text({"messages": requests[name]}) for name in names}
    applied = _aider_coders(home, "apply", stdin=json.dumps(answers))
    return {n: {"request": requests[n], "answer": answers[n], **applied[n]} for n in names}


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.value)
def test_aider_applies_the_answer_to_its_own_request(
    aider_applied: dict[str, Any], fmt: EditFormat
) -> None:
    seen = aider_applied[fmt.value]
    assert edit_format_of({"messages": seen["request"]}) is READ_AS.get(fmt, fmt)
    assert seen["error"] is None, seen
    # the coder's task is aider_coders.TASK
    assert seen["files"] == {"hello.txt": "hello from aider\n"}, seen


# ------------------------------------------------------------------ aider, through the gateway


def check_aider_run(run: AgentRun) -> None:
    """The edit applied and committed, aider ended well, nothing refused, and a break got
    through within the call it happened in (chat_agents.aider_problems)."""
    found = aider_problems(run)
    assert not found, "; ".join(found) + "\n" + run.summary()


@pytest.mark.parametrize("point", TEXT_POINTS, ids=lambda p: p.value)
@pytest.mark.parametrize("agent", ["aider"])
def test_aider_does_the_task_through_the_gateway(
    agent_runs: AgentRuns, agent: str, point: BreakPoint
) -> None:
    check_aider_run(agent_runs.result(agent, point))


@pytest.mark.parametrize("point", [BreakPoint.NONE], ids=lambda p: p.value)
@pytest.mark.parametrize("agent", ["aider-diff", "aider-udiff"])
def test_aider_does_the_task_in_its_other_edit_formats(
    agent_runs: AgentRuns, agent: str, point: BreakPoint
) -> None:
    assert agent in AGENTS
    check_aider_run(agent_runs.result(agent, point))
