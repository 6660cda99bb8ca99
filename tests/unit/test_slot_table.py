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
CONVERSATION = ("t", "agent_turn")

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
    assert not table.take_own(0, "task:a")  # a call is in it
    table.release(0)
    assert not table.take_own(0, "task:b")
    assert table.take_own(0, "task:a")
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
    one = table.take("task:a", ("t", "one"))
    two = table.take("task:a", ("t", "two"))
    assert one is not None and two is not None and one.index != two.index
    table.release(one.index)
    table.release(two.index)
    back = table.take("task:a", ("t", "one"))
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
