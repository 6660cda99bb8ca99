"""The workload caller: each request's messages from the model's own answers."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest
from bench.inference.caller import (
    NO_MORE_OUTPUT,
    SUMMARY_PREFIX,
    Caller,
    CallerError,
    Request,
    answer_message,
)
from bench.inference.workload import Workload, load_workload
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

WORKLOADS = {
    name: load_workload(name) for name in ("tool-loop", "condensed", "two-purposes", "resumed")
}
_ids = itertools.count()


def tool_call(name: str = "read_file", args: str = '{"path": "README.md"}') -> dict[str, Any]:
    return {
        "id": f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def text(content: str, reasoning: str | None = "thinking...") -> dict[str, Any]:
    return {"role": "assistant", "content": content, "reasoning_content": reasoning}


def calls(*tool_calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": list(tool_calls),
        "reasoning_content": "r",
    }


def run(
    workload: Workload, answers: Sequence[dict[str, Any]], keep_reasoning: bool = False
) -> list[Request]:
    caller = Caller(workload, keep_reasoning=keep_reasoning)
    requests = []
    for answer in answers:
        requests.append(caller.next_request())
        caller.record_answer(answer)
    assert caller.done
    return requests


def test_first_request_is_the_system_prompt_and_the_task() -> None:
    workload = WORKLOADS["tool-loop"]
    request = Caller(workload).next_request()
    assert [m["role"] for m in request.messages] == ["system", "user"]
    assert request.messages[1]["content"] == workload.steps[0].text
    assert request.tools == list(workload.purposes["agent_turn"].tools)
    assert (request.task, request.purpose, request.restart_before) == (
        "bench-tool-loop",
        "agent_turn",
        False,
    )


def test_an_answer_goes_back_as_written_without_its_reasoning() -> None:
    caller = Caller(WORKLOADS["tool-loop"])
    caller.next_request()
    caller.record_answer(text("I will list the files.", reasoning="the user wants"))
    request = caller.next_request()
    assert request.messages[2] == {"role": "assistant", "content": "I will list the files."}
    assert request.messages[3] == {"role": "user", "content": WORKLOADS["tool-loop"].steps[1].text}


def test_direct_mode_keeps_the_reasoning() -> None:
    caller = Caller(WORKLOADS["tool-loop"], keep_reasoning=True)
    caller.next_request()
    message = caller.record_answer(text("a", reasoning="because"))
    assert message == {"role": "assistant", "content": "a", "reasoning_content": "because"}


def test_tool_calls_get_the_input_as_results_for_their_own_ids() -> None:
    workload = WORKLOADS["tool-loop"]
    caller = Caller(workload)
    caller.next_request()
    first, second = tool_call("list_dir", '{"path": "."}'), tool_call("search", '{"pattern": "x"}')
    written = caller.record_answer(calls(first, second))
    assert written == {"role": "assistant", "content": None, "tool_calls": [first, second]}
    request = caller.next_request()
    assert request.messages[-2:] == [
        {"role": "tool", "tool_call_id": first["id"], "content": workload.steps[1].text},
        {"role": "tool", "tool_call_id": second["id"], "content": NO_MORE_OUTPUT},
    ]


def test_an_empty_answer_goes_back_empty() -> None:
    assert answer_message({"content": None}) == {"role": "assistant", "content": ""}


def test_calls_out_of_turn_are_refused() -> None:
    caller = Caller(WORKLOADS["tool-loop"])
    with pytest.raises(CallerError):
        caller.record_answer(text("x"))
    caller.next_request()
    with pytest.raises(CallerError):
        caller.next_request()
    for _ in range(len(WORKLOADS["tool-loop"].steps)):
        caller.record_answer(text("x"))
        if not caller.done:
            caller.next_request()
    with pytest.raises(CallerError):
        caller.next_request()


def test_condensation_keeps_turn_1_and_the_answer_of_turn_11() -> None:
    workload = WORKLOADS["condensed"]
    # turn 1 calls a tool, turn 10 calls a tool (its result is turn 11's input), others talk
    answers = [
        calls(tool_call()) if i in (0, 9) else text(f"answer {i + 1}")
        for i in range(len(workload.steps))
    ]
    requests = run(workload, answers)
    turn12 = requests[11].messages
    a1 = answer_message(answers[0])
    assert turn12[:3] == [
        {"role": "system", "content": workload.purposes["agent_turn"].system},
        {"role": "user", "content": workload.steps[0].text},
        a1,
    ]
    assert turn12[3] == {
        "role": "tool",
        "tool_call_id": a1["tool_calls"][0]["id"],
        "content": workload.steps[1].text,
    }
    summary = workload.steps[11].condense
    assert summary is not None
    assert turn12[4] == {"role": "user", "content": SUMMARY_PREFIX + summary.summary}
    assert turn12[5:] == [
        {"role": "assistant", "content": "answer 11"},
        {"role": "user", "content": workload.steps[11].text},
    ]
    # after it, the history grows from the condensed one
    assert requests[12].messages[: len(turn12)] == turn12


def test_resumed_passes_the_restart_on() -> None:
    requests = run(WORKLOADS["resumed"], [text("x")] * len(WORKLOADS["resumed"].steps))
    assert [r.step.index for r in requests if r.restart_before] == [11]


def test_each_purpose_is_its_own_conversation() -> None:
    workload = WORKLOADS["two-purposes"]
    requests = run(workload, [text(f"{i}") for i in range(len(workload.steps))])
    for purpose in ("agent_turn", "planner", "verification"):
        mine = [r for r in requests if r.purpose == purpose]
        assert all(r.messages[0]["content"] == workload.purposes[purpose].system for r in mine)
        # a conversation holds only its own steps' inputs
        assert len(mine[-1].messages) == 1 + 2 * len(mine) - 1
    assert next(r for r in requests if r.purpose == "planner").tools == []


# -- properties over any answers the model may give


@st.composite
def model_answer(draw: st.DrawFn) -> dict[str, Any]:
    n_calls = draw(st.integers(0, 3))
    answer: dict[str, Any] = {
        "role": "assistant",
        "content": draw(st.one_of(st.none(), st.text(max_size=12))),
        "tool_calls": [
            tool_call(draw(st.sampled_from(["read_file", "search"])), draw(st.text(max_size=8)))
            for _ in range(n_calls)
        ],
    }
    if draw(st.booleans()):
        answer["reasoning_content"] = draw(st.text(min_size=1, max_size=12))
    return answer


def check_history(messages: Sequence[dict[str, Any]], written: Sequence[dict[str, Any]]) -> None:
    """The messages are valid and every assistant message is one the model wrote, in order."""
    assert messages[0]["role"] == "system"
    assert all(m["role"] != "system" for m in messages[1:])
    assert messages[-1]["role"] in ("user", "tool")
    own = [m for m in messages if m["role"] == "assistant"]
    it = iter(written)
    assert all(any(m == w for w in it) for m in own), "an assistant message the model did not write"
    assert all("reasoning_content" not in m for m in messages)
    # tool results directly follow the answer that called them, one per call, in order
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            results = messages[i + 1 : i + 1 + len(ids)]
            assert [r.get("tool_call_id") for r in results] == ids
        if m["role"] == "tool":
            before = messages[i - 1]
            assert before["role"] in ("assistant", "tool")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(WORKLOADS)), data=st.data())
def test_the_history_holds_only_what_the_model_wrote(name: str, data: st.DataObject) -> None:
    workload = WORKLOADS[name]
    caller = Caller(workload)
    written: dict[str, list[dict[str, Any]]] = {}
    previous: dict[str, list[dict[str, Any]]] = {}
    rewrites = 0
    while not caller.done:
        request = caller.next_request()
        check_history(request.messages, written.get(request.purpose, []))
        before = previous.get(request.purpose)
        if before is not None and request.messages[: len(before)] != before:
            rewrites += 1
            assert request.step.condense is not None
        message = caller.record_answer(data.draw(model_answer()))
        written.setdefault(request.purpose, []).append(message)
        previous[request.purpose] = [*request.messages, message]
    # the history only grows, but where the workload condenses it
    assert rewrites == workload.expected_history_rewrites
