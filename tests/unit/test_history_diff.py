"""``changed``: the first message that differs from the previous request of the same kind."""

from __future__ import annotations

from boundedcode_gateway.policy.history_diff import HistoryTracker

SYSTEM = {"role": "system", "content": "You are a coder."}
USER1 = {"role": "user", "content": "Fix the bug."}
ANSWER1 = {"role": "assistant", "content": "Done.", "reasoning_content": "look at x"}
USER2 = {"role": "user", "content": "Thanks, now test it."}


def test_first_request_and_growth_are_minus_one() -> None:
    t = HistoryTracker()
    assert t.observe("t", "agent_turn", [SYSTEM, USER1]) == -1
    assert t.observe("t", "agent_turn", [SYSTEM, USER1, ANSWER1, USER2]) == -1


def test_rewrite_gives_index_of_first_difference() -> None:
    t = HistoryTracker()
    t.observe("t", "agent_turn", [SYSTEM, USER1, ANSWER1, USER2])
    summary = {"role": "user", "content": "Summary of earlier work."}
    assert t.observe("t", "agent_turn", [SYSTEM, summary, USER2]) == 1


def test_dropped_reasoning_counts_as_a_change() -> None:
    t = HistoryTracker()
    t.observe("t", "agent_turn", [SYSTEM, USER1, ANSWER1])
    stripped = {"role": "assistant", "content": "Done."}
    assert t.observe("t", "agent_turn", [SYSTEM, USER1, stripped, USER2]) == 2


def test_key_order_does_not_count() -> None:
    t = HistoryTracker()
    t.observe("t", "agent_turn", [{"role": "user", "content": "a"}])
    assert t.observe("t", "agent_turn", [{"content": "a", "role": "user"}, USER2]) == -1


def test_shortened_history_is_a_change_where_it_ends() -> None:
    t = HistoryTracker()
    t.observe("t", "agent_turn", [SYSTEM, USER1, ANSWER1])
    assert t.observe("t", "agent_turn", [SYSTEM, USER1]) == 2


def test_tasks_and_purposes_are_compared_separately() -> None:
    t = HistoryTracker()
    t.observe("t", "agent_turn", [SYSTEM, USER1])
    assert t.observe("t", "condenser", [USER2]) == -1
    assert t.observe("other", "agent_turn", [USER2]) == -1
    assert t.observe("t", "agent_turn", [USER2]) == 0


def test_the_table_is_bounded() -> None:
    t = HistoryTracker(max_keys=2)
    for task in ("a", "b", "c"):
        t.observe(task, "agent_turn", [USER1])
    # "a" was evicted, so a rewrite of it is not seen as one
    assert t.observe("a", "agent_turn", [USER2]) == -1
    assert t.observe("c", "agent_turn", [USER2]) == 0
