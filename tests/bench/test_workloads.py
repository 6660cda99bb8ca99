"""The inference benchmark's workloads: regenerated identically, shaped as the benchmark needs."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from bench.inference.workload import (
    WORKLOADS_DIR,
    WorkloadError,
    estimate_tokens,
    load_workload,
    parse_workload,
)
from bench.workloads import generate

NAMES = ("tool-loop", "condensed", "two-purposes", "resumed")
FILE_READ = re.compile(r"\A(\S+) \((\d+) bytes\):\n", re.S)


def test_regenerating_gives_the_shipped_files_byte_for_byte(tmp_path: Path) -> None:
    assert generate.main(["--out", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(f"{n}.json" for n in NAMES)
    for name in written:
        assert (tmp_path / name).read_bytes() == (WORKLOADS_DIR / name).read_bytes(), name
    assert generate.main(["--check"]) == 0


def test_check_names_a_file_that_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    generate.main(["--out", str(tmp_path)])
    (tmp_path / "resumed.json").write_text("{}")
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1
    assert "resumed.json" in capsys.readouterr().err


@pytest.mark.parametrize("name", NAMES)
def test_each_workload_is_shaped_like_a_coding_agent(name: str) -> None:
    workload = load_workload(name)
    data = orjson.loads((WORKLOADS_DIR / f"{name}.json").read_bytes())
    agent = [s for s in workload.steps if s.purpose == "agent_turn"]
    assert workload.name == name and workload.task == f"bench-{name}"
    assert len(agent) >= 20
    assert agent[0].kind == "task"
    # a ~2k-token system prompt and the tools
    system = workload.purposes["agent_turn"].system
    assert 1900 <= estimate_tokens(system) <= 2100
    assert {t["function"]["name"] for t in workload.purposes["agent_turn"].tools} == {
        "read_file",
        "list_dir",
        "search",
        "edit_file",
        "run_tests",
    }
    # file reads of several KB
    reads = [s for s in agent if s.kind == "file_read"]
    assert len(reads) >= 4
    for step in reads:
        match = FILE_READ.match(step.text)
        assert match is not None, step.text[:80]
        assert 1500 <= int(match.group(2)) <= 3000
        assert len(step.text) - match.end() == int(match.group(2))
    # every prompt under the limit, by the estimate the file states (recomputed here)
    peaks = generate.peak_prompts(data)
    assert peaks == data["estimate"]["peak_prompt_tokens"]
    assert max(peaks.values()) <= generate.PROMPT_LIMIT_TOKENS
    assert data["estimate"]["chars_per_token"] == 3.5


def test_condensed_condenses_turns_2_to_10_once_in_turn_12() -> None:
    workload = load_workload("condensed")
    condensing = [s for s in workload.steps if s.condense is not None]
    assert [(s.turn, s.condense.first, s.condense.last) for s in condensing if s.condense] == [
        (12, 2, 10)
    ]
    assert workload.expected_history_rewrites == 1
    # the same loop as tool-loop otherwise
    plain = load_workload("tool-loop")
    assert [(s.kind, s.text) for s in workload.steps] == [(s.kind, s.text) for s in plain.steps]


def test_resumed_restarts_between_turns_10_and_11() -> None:
    workload = load_workload("resumed")
    assert [s.index for s in workload.steps if s.restart_before] == [11]
    assert workload.expected_history_rewrites == 0


def test_two_purposes_interleaves_planner_and_verification_on_one_task() -> None:
    workload = load_workload("two-purposes")
    order = [s.purpose for s in workload.steps]
    assert set(order) == {"agent_turn", "planner", "verification"}
    assert order.count("planner") == 3 and order.count("verification") == 3
    # each side call sits between agent turns
    for i, purpose in enumerate(order[1:-1], start=1):
        if purpose != "agent_turn":
            assert "agent_turn" in order[:i] and "agent_turn" in order[i + 1 :]
    assert workload.purposes["planner"].tools == ()
    assert workload.expected_history_rewrites == 0


def test_only_tool_loop_shapes_have_no_condensation_or_restart() -> None:
    for name in ("tool-loop", "two-purposes"):
        workload = load_workload(name)
        assert not any(s.condense or s.restart_before for s in workload.steps)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": 2}, "format 2"),
        ({"seed": True}, "'seed'"),
        (
            {"steps": [{"index": 1, "purpose": "nobody", "turn": 1, "kind": "user", "text": ""}]},
            "unknown purpose",
        ),
        (
            {
                "steps": [
                    {"index": 2, "purpose": "agent_turn", "turn": 1, "kind": "user", "text": ""}
                ]
            },
            "numbering",
        ),
    ],
)
def test_a_malformed_workload_is_named(change: dict[str, object], message: str) -> None:
    data = orjson.loads((WORKLOADS_DIR / "tool-loop.json").read_bytes())
    data.update(change)
    with pytest.raises(WorkloadError, match=message):
        parse_workload(data)


def test_a_condensation_needs_turns_to_keep() -> None:
    data = orjson.loads((WORKLOADS_DIR / "condensed.json").read_bytes())
    data["steps"][11]["condense"]["last"] = 11
    with pytest.raises(WorkloadError, match="cannot condense"):
        parse_workload(data)
