"""Naming a cache miss, and the keeper's pure steps: golden cases and properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.llama_server.cache_keeper import (
    cut_at_sentinel,
    next_request_messages,
    pick_slot,
    repair_report,
    text_evidence,
)
from boundedcode_gateway.policy.cache_misses import (
    MISS_TOLERANCE_TOKENS,
    AnswerEvidence,
    ContinuityTable,
    PreviousCall,
    TextVerdict,
    classify,
    common_prefix_length,
    token_ends_after,
)

PREVIOUS = PreviousCall(prompt_tokens=100, completion_tokens=50, answer_index=3)


def previous(evidence: AnswerEvidence | None) -> PreviousCall:
    return PreviousCall(100, 50, 3, evidence)


def test_no_cache_numbers_no_report() -> None:
    assert classify(PREVIOUS, None, 10, -1) is None
    assert classify(PREVIOUS, 10, None, -1) is None


def test_first_call() -> None:
    report = classify(None, 120, 0, -1)
    assert report is not None and (report.cause, report.reusable_tokens) == ("first_call", None)


def test_none_within_the_tolerance() -> None:
    report = classify(PREVIOUS, 170, 150 - MISS_TOLERANCE_TOKENS, -1)
    assert report is not None and report.cause == "none" and report.reusable_tokens == 150
    report = classify(PREVIOUS, 170, 150 - MISS_TOLERANCE_TOKENS - 1, -1)
    assert report is not None and report.cause == "server"


def test_reusable_is_capped_by_the_prompt() -> None:
    # a shorter prompt than the previous conversation: only the prompt could be reused
    report = classify(PREVIOUS, 80, 79, 2)
    assert report is not None and report.reusable_tokens == 80 and report.cause == "none"


def test_history_rewrite_names_the_message() -> None:
    report = classify(previous(AnswerEvidence("match")), 170, 40, 1)
    assert report is not None
    assert (report.cause, report.at) == ("history_rewrite", {"message": 1})


def test_token_split_needs_the_text_to_match() -> None:
    evidence = AnswerEvidence("match", token_ends=(3, 7, 12, 20))
    report = classify(previous(evidence), 170, 102, -1)
    assert report is not None
    assert (report.cause, report.at) == ("token_split", {"message": 3, "char": 7})
    # unknown text: the gateway cannot prove it
    report = classify(previous(AnswerEvidence("unknown")), 170, 102, -1)
    assert report is not None and (report.cause, report.at) == ("server", None)
    report = classify(previous(None), 170, 102, -1)
    assert report is not None and report.cause == "server"


def test_a_miss_before_the_answer_is_the_servers() -> None:
    report = classify(previous(AnswerEvidence("match")), 170, 30, -1)
    assert report is not None and report.cause == "server"


def test_template_and_dropped_reasoning_carry_their_offset() -> None:
    verdicts: tuple[TextVerdict, ...] = ("template_render", "reasoning_dropped")
    for verdict in verdicts:
        evidence = AnswerEvidence(verdict, diverged_at=5)
        report = classify(previous(evidence), 170, 101, -1)
        assert report is not None
        assert (report.cause, report.at) == (verdict, {"message": 3, "char": 5})


def test_text_evidence() -> None:
    prompt, generated = "<u>q</u><a><think>\n", "why</think>answer"
    rendered = prompt + generated + "<end>\n<u>"
    assert text_evidence(prompt, generated, rendered, True, True).verdict == "match"
    trimmed = prompt + "why</think>\nanswer<end>"
    evidence = text_evidence(prompt, generated, trimmed, True, True)
    assert (evidence.verdict, evidence.diverged_at) == ("template_render", len("why</think>"))
    dropped = prompt + "</think>answer<end>"
    evidence = text_evidence(prompt, generated, dropped, True, False)
    assert (evidence.verdict, evidence.diverged_at) == ("reasoning_dropped", 0)
    # a template that renders a turn without reasoning without its think block: the
    # rendering departs where the generation prompt opened it, just before the answer
    no_block = "<u>q</u><a>answer<end>"
    evidence = text_evidence(prompt, generated, no_block, True, False, "answer")
    assert (evidence.verdict, evidence.diverged_at) == ("reasoning_dropped", 0)
    # the same with the reasoning taken back is the template's doing
    assert text_evidence(prompt, generated, no_block, True, True, "answer").verdict == (
        "template_render"
    )
    # an earlier turn renders differently now: the template's doing, whatever was dropped
    earlier = "<u>Q</u>" + generated
    assert text_evidence(prompt, generated, earlier, True, False, "answer").verdict == (
        "template_render"
    )


def test_repair_report() -> None:
    evidence = AnswerEvidence("match", token_ends=(4, 9))
    assert repair_report(previous(evidence), 146).cause == "none"
    report = repair_report(previous(evidence), 101)
    assert (report.cause, report.at) == ("token_split", {"message": 3, "char": 4})
    assert repair_report(previous(None), 101).cause == "server"


def test_sentinel_follows_what_comes_next() -> None:
    text = {"role": "assistant", "content": "hi"}
    assert next_request_messages([], text)[-1]["role"] == "user"
    calls = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]}
    follow = next_request_messages([], calls)[-1]
    assert follow["role"] == "tool" and follow["tool_call_id"] == "c1"
    rendered = "<u>" + str(follow["content"]) + "</u>"
    assert cut_at_sentinel(rendered) == "<u>"
    assert cut_at_sentinel("no sentinel here") is None


def test_pick_slot() -> None:
    slots = [
        {"id": 0, "is_processing": True, "prompt": "P"},
        {"id": 1, "is_processing": False, "prompt": "other"},
        {"id": 2, "is_processing": False, "prompt": "<bos>P"},
    ]
    assert pick_slot(slots, "P") == slots[2]
    assert pick_slot(slots[:2], "P") is None
    assert pick_slot({"error": "no slots endpoint"}, "P") is None


@given(st.text(max_size=40), st.text(max_size=40), st.text(max_size=40))
def test_common_prefix_length(shared: str, a: str, b: str) -> None:
    n = common_prefix_length(shared + a, shared + b)
    assert n >= len(shared)
    assert (shared + a)[:n] == (shared + b)[:n]
    assert n == min(len(shared + a), len(shared + b)) or (shared + a)[n] != (shared + b)[n]


@given(st.lists(st.text(min_size=1, max_size=5), max_size=30), st.integers(0, 60))
def test_token_ends_name_each_token_start(pieces: list[str], start: int) -> None:
    """The k-th end offset is where token (first after ``start``) + k + 1 begins."""
    text = "".join(pieces)
    start = min(start, len(text))
    ends = token_ends_after(pieces, start)
    assert list(ends) == sorted(ends) and all(e > 0 for e in ends)
    assert not ends or ends[-1] == len(text) - start


def _logged(purpose: str, prompt: int, completion: int = 0, **extra: object) -> dict[str, object]:
    return {
        "task": "t",
        "purpose": purpose,
        "model_profile": "local",
        "status": "ok",
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "messages": 3,
        "miss_cause": "none",
        **extra,
    }


def test_the_table_read_back_from_a_call_log() -> None:
    table = ContinuityTable.from_call_log(
        [
            _logged("agent_turn", 100, 20, messages=1),
            _logged("cache_repair", 126),
            _logged("agent_turn", 150, 30),  # the last of its conversation counts
            _logged("planner", 40, 5, miss_cause=None),  # a server without a cache report
            _logged("agent_turn", 999, 1, status="error"),
            _logged("verification", 60, True),  # completion_tokens is not a count
            {"task": "t", "purpose": 7, "model_profile": "local"},
        ]
    )
    agent = table.previous(("t", "agent_turn", "local", ""))
    assert agent is not None
    assert (agent.prompt_tokens, agent.completion_tokens, agent.answer_index) == (150, 30, 3)
    assert agent.repaired_tokens is None  # the repair followed the earlier answer
    assert table.previous(("t", "planner", "local", "")) is None
    assert table.previous(("t", "verification", "local", "")) is None
    repaired = ContinuityTable.from_call_log(
        [_logged("agent_turn", 100, 20), _logged("cache_repair", 126)]
    ).previous(("t", "agent_turn", "local", ""))
    assert repaired is not None and repaired.reusable_tokens == 126


def test_each_conversation_of_a_task_is_read_back_on_its_own() -> None:
    table = ContinuityTable.from_call_log(
        [
            _logged("agent_turn", 100, 20, conversation="a1"),
            _logged("agent_turn", 30, 5, conversation="b2"),  # a title request between
        ]
    )
    agent = table.previous(("t", "agent_turn", "local", "a1"))
    title = table.previous(("t", "agent_turn", "local", "b2"))
    assert agent is not None and agent.prompt_tokens == 100
    assert title is not None and title.prompt_tokens == 30
    # the agent's next call is compared with its own, the history it is sent with with
    # the title's
    assert table.compared(("t", "agent_turn", "local", "a1")) == (agent, False)
    assert table.compared(("t", "agent_turn", "local", "b2")) == (title, True)
    # a conversation's first call is compared with the task's last: a rewrite of the
    # first message is named as one
    assert table.compared(("t", "agent_turn", "local", "c3")) == (title, True)
    assert table.compared(("u", "agent_turn", "local", "a1")) == (None, True)
