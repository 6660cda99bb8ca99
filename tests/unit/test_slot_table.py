"""Slots under cache isolation (llama_server/slots.py, pool.pin_body): a call only ever
runs in a slot that holds nothing of another group's, a group's own free slot is taken
before anyone else's, and a request is pinned to its slot whatever it was before."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.llama_server.pool import pin_body
from boundedcode_gateway.llama_server.slots import SlotTable

GROUPS = ("task:a", "task:b", "task:c")
CONVERSATION = ("t", "agent_turn", "")

# each step: take a slot for a group, or release the n-th slot in use
steps = st.lists(
    st.one_of(
        st.tuples(st.just("take"), st.sampled_from(GROUPS)),
        st.tuples(st.just("release"), st.integers(min_value=0, max_value=3)),
    ),
    max_size=60,
)


@given(st.integers(min_value=1, max_value=4), steps)
def test_no_call_runs_in_a_slot_that_holds_another_groups_prompts(
    count: int, plan: list[tuple[str, object]]
) -> None:
    table = SlotTable(count)
    # what each slot holds as the server would: the groups whose calls ran in it since it
    # was last erased
    held: list[set[str]] = [{"?"} for _ in range(count)]  # unknown before the first use
    in_use: list[int] = []
    for action, arg in plan:
        if action == "take":
            group = str(arg)
            own_free = [i for i in range(count) if i not in in_use and table.owner(i) == group]
            grant = table.take(group, CONVERSATION)
            if grant is None:
                assert len(in_use) == count  # only when every slot is taken
                continue
            assert grant.index not in in_use
            if own_free:
                assert grant.index in own_free and not grant.erase
            if grant.erase:
                held[grant.index] = set()
            assert held[grant.index] <= {group}, "a call would read another group's cache"
            held[grant.index].add(group)
            in_use.append(grant.index)
        elif in_use:
            index = in_use.pop(int(str(arg)) % len(in_use))
            table.release(index)


def test_a_failed_erase_leaves_the_slot_to_be_erased_before_any_use() -> None:
    table = SlotTable(1)
    grant = table.take("task:a", CONVERSATION)
    assert grant is not None and grant.erase
    table.release(grant.index, erased=False)
    again = table.take("task:a", CONVERSATION)
    assert again is not None and again.erase  # not known to be a's alone


def test_the_keeper_repairs_only_in_a_free_slot_still_its_groups() -> None:
    table = SlotTable(1)
    grant = table.take("task:a", CONVERSATION)
    assert grant is not None
    assert not table.take_own(0, "task:a", CONVERSATION)  # a call is in it
    table.release(0)
    assert not table.take_own(0, "task:b", CONVERSATION)
    assert table.take_own(0, "task:a", CONVERSATION)
    assert table.take("task:b", CONVERSATION) is None  # the repair holds it
    table.release(0)
    taken = table.take("task:b", CONVERSATION)
    assert taken is not None and taken.erase


def test_a_call_waits_for_a_slot_while_all_are_in_use() -> None:
    async def scenario() -> None:
        table = SlotTable(1)
        first = await table.acquire("task:a", CONVERSATION)
        waiting = asyncio.create_task(table.acquire("task:b", CONVERSATION))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        table.release(first.index)
        second = await asyncio.wait_for(waiting, 1)
        assert second.index == 0 and second.erase

    asyncio.run(scenario())


def test_the_conversation_that_used_a_slot_last_goes_back_to_it() -> None:
    table = SlotTable(2)
    one = table.take("task:a", ("t", "one", ""))
    two = table.take("task:a", ("t", "two", ""))
    assert one is not None and two is not None and one.index != two.index
    table.release(one.index)
    table.release(two.index)
    back = table.take("task:a", ("t", "one", ""))
    assert back is not None and back.index == one.index and not back.erase


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [], "model": "m"},
        {"id_slot": 7, "messages": []},
        {"id_slot": 12345, "model": "m"},
    ],
)
def test_a_request_is_pinned_to_its_slot_with_one_id_slot(body: dict[str, object]) -> None:
    # as the adapter wrote it, or pinned before (a continuation of it, after a failover)
    pinned = pin_body(orjson.dumps(body), 3)
    assert pinned.startswith(b'{"id_slot":3,')
    assert pinned.count(b'"id_slot"') == 1
    parsed = orjson.loads(pinned)
    assert parsed["id_slot"] == 3
    assert {k: v for k, v in parsed.items() if k != "id_slot"} == {
        k: v for k, v in body.items() if k != "id_slot"
    }
    assert pin_body(pinned, 3) == pinned


# -- slots saved per conversation (slot files): no isolation, every call pinned

CONVERSATIONS = [("t", "agent", "h1"), ("t", "agent", "h2"), ("u", "agent", "h1"), ("v", "x", "")]

conversation_steps = st.lists(
    st.one_of(
        st.tuples(st.just("take"), st.integers(min_value=0, max_value=3)),
        st.tuples(st.just("release"), st.integers(min_value=0, max_value=3)),
        st.tuples(st.just("save"), st.integers(min_value=0, max_value=3)),
    ),
    max_size=80,
)


@given(st.integers(min_value=1, max_value=3), conversation_steps)
def test_no_conversations_unsaved_tokens_are_lost_and_a_held_one_gets_its_slot(
    count: int, plan: list[tuple[str, int]]
) -> None:
    table = SlotTable(count, isolated=False)
    # what each slot holds as the server would, and whether that is in its file
    holds: list[tuple[str, str, str] | None] = [None] * count
    unsaved: list[bool] = [False] * count
    in_use: list[int] = []
    for action, arg in plan:
        if action == "take":
            conversation = CONVERSATIONS[arg]
            free_holding = [i for i in range(count) if i not in in_use and holds[i] == conversation]
            grant = table.take(None, conversation)
            if grant is None:
                assert len(in_use) == count
                continue
            assert not grant.erase  # no isolation: nothing is erased
            if free_holding:
                assert grant.resident and grant.index in free_holding
            elif holds[grant.index] is not None and unsaved[grant.index]:
                # another conversation's unsaved tokens: handed over to be saved first
                assert grant.leaving is not None
                assert grant.leaving.conversation == holds[grant.index]
            else:
                assert grant.leaving is None
            if not grant.resident:
                holds[grant.index], unsaved[grant.index] = conversation, False
            in_use.append(grant.index)
        elif action == "release" and in_use:
            index = in_use.pop(arg % len(in_use))
            table.filled(index, 100)  # the call left tokens its file does not have
            unsaved[index] = True
            table.release(index)
        elif action == "save":
            index = arg % count
            occupant = table.hold_unsaved(index)
            if index in in_use or not unsaved[index]:
                assert occupant is None
                continue
            assert occupant is not None and occupant.conversation == holds[index]
            table.saved(index)
            unsaved[index] = False
            table.release(index)


def test_a_restarted_server_holds_nothing() -> None:
    table = SlotTable(1, isolated=False)
    grant = table.take(None, CONVERSATIONS[0])
    assert grant is not None and not grant.resident
    table.filled(0, 50)
    table.release(0)
    table.emptied(1)
    assert table.generation == 1
    again = table.take(None, CONVERSATIONS[0])
    assert again is not None and not again.resident and again.leaving is None


def test_idle_slots_are_found_once_idle_long_enough() -> None:
    now = [0.0]
    table = SlotTable(2, isolated=False, clock=lambda: now[0])
    grant = table.take(None, CONVERSATIONS[0])
    assert grant is not None
    table.filled(grant.index, 10)
    table.release(grant.index)
    assert table.idle_unsaved(5.0) == []
    now[0] = 6.0
    assert table.idle_unsaved(5.0) == [grant.index]


def test_a_conversation_moving_on_is_held_for_its_save_only_while_it_has_unsaved_tokens() -> None:
    table = SlotTable(2, isolated=True)
    grant = table.take("task:a", CONVERSATIONS[0])
    assert grant is not None
    # in use: not held for a save
    assert table.hold_conversation("task:a", CONVERSATIONS[0]) is None
    table.filled(grant.index, 120)
    table.release(grant.index)
    # another group's, or another conversation's: not its
    assert table.hold_conversation("task:b", CONVERSATIONS[0]) is None
    assert table.hold_conversation("task:a", CONVERSATIONS[1]) is None
    held = table.hold_conversation("task:a", CONVERSATIONS[0])
    assert held is not None and held[0] == grant.index
    assert (held[1].conversation, held[1].tokens) == (CONVERSATIONS[0], 120)
    table.saved(grant.index)
    table.release(grant.index)
    assert table.hold_conversation("task:a", CONVERSATIONS[0]) is None  # nothing unsaved
    again = table.take("task:a", CONVERSATIONS[0])
    # back in its slot: what the slot holds of it, for a newer file to be restored over
    assert again is not None and again.resident and again.tokens == 120
