"""Which server of a simulated pool a call goes to, and the reason it gives."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.config import Routing
from boundedcode_gateway.pools.holdings import ConversationKey
from boundedcode_gateway.pools.routing import (
    NoHealthyServer,
    Pool,
    Speeds,
    choose,
    expected_cached,
    expected_seconds,
)
from boundedcode_gateway.pools.server_state import DEFAULT_PREFILL_TPS, ServerState

K = ("task-1", "agent_turn")
OTHER = ("task-2", "agent_turn")


def server(
    name: str,
    *,
    parallel: int = 1,
    holds: int = 0,
    in_flight: int = 0,
    busy_slots: int | None = None,
    healthy: bool = True,
    tps: float | None = None,
    slot_s: float | None = None,
) -> ServerState:
    """A server holding ``holds`` tokens of conversation K, with the given load and speed."""
    s = ServerState(name, parallel, healthy=healthy)
    if holds:
        s.holdings.answered(K, 0, holds, 0)
    for _ in range(in_flight):
        s.call_started()
    s.slots_read(busy_slots)
    if tps is not None or slot_s is not None:
        s.measured(1000, 1000 * 1000 / tps if tps else None, slot_s * 1000 if slot_s else None)
    return s


def names(servers: list[ServerState], key: ConversationKey = K, prompt: int = 10_000) -> str:
    choice = choose(key, prompt, servers)
    return f"{choice.server.name} {choice.reason}"


def test_a_call_goes_where_most_of_its_conversation_is_cached() -> None:
    pool = [server("a", holds=3000), server("b", holds=7000), server("c")]
    choice = choose(K, 8000, pool)
    assert (choice.index, choice.reason, choice.held_by, choice.cached_tokens) == (
        1,
        "stayed",
        1,
        7000,
    )
    # another conversation, held nowhere, goes elsewhere: the least busy, holding least
    assert names(pool, OTHER) == "c new"


def test_expected_cached_tokens_count_no_more_than_the_prompt() -> None:
    pool = [server("a", holds=9000), server("b", holds=12_000)]
    choice = choose(K, 5000, pool)
    assert (choice.server.name, choice.cached_tokens) == ("b", 5000)
    assert expected_cached(pool[0], K, 5000) == 5000
    assert expected_cached(pool[0], K, -1) == 0


def test_a_busy_server_keeps_its_conversation_when_no_other_is_faster() -> None:
    # 100k of a 101k prompt cached: the rest evaluated after a 2 s wait beats 101k anew
    pool = [
        server("a", holds=100_000, in_flight=1, tps=500, slot_s=2),
        server("b", tps=500, slot_s=2),
    ]
    assert names(pool, prompt=101_000) == "a stayed"


def test_a_busy_server_loses_its_conversation_to_a_faster_one() -> None:
    # a holds half of a 2000-token prompt but waits 20 s for a slot; b reads it all in 2 s
    pool = [
        server("a", holds=1000, in_flight=1, tps=1000, slot_s=20),
        server("b", tps=1000, slot_s=20),
    ]
    choice = choose(K, 2000, pool)
    assert (choice.server.name, choice.reason, choice.held_by, choice.cached_tokens) == (
        "b",
        "rebalanced",
        0,
        0,
    )
    a, b = pool
    speeds = Speeds.of_pool(pool)
    assert expected_seconds(a, 1000, 2000, speeds) == pytest.approx(1 + 20)
    assert expected_seconds(b, 0, 2000, speeds) == pytest.approx(2)


def test_the_busy_slots_read_from_the_server_count_as_busy() -> None:
    pool = [
        server("a", parallel=2, holds=1000, busy_slots=2, tps=1000, slot_s=20),
        server("b", parallel=2, tps=1000, slot_s=20),
    ]
    assert names(pool, prompt=2000) == "b rebalanced"
    pool[0].slots_read(1)  # one slot free: no wait
    assert names(pool, prompt=2000) == "a stayed"


def test_a_lone_conversation_stays_on_its_idle_server_whatever_a_stale_reading_says() -> None:
    pool = [
        server("a", holds=1000, tps=1000, slot_s=20),
        server("b", tps=1000, slot_s=20),
    ]
    # read during the conversation's own last call, which has ended since
    pool[0].call_started()
    pool[0].slots_read(1)
    pool[0].call_ended()
    assert names(pool, prompt=2000) == "a stayed"
    # read during the cache repair that follows it, which gives way to the next call
    with pool[0].working():
        pool[0].slots_read(1)
        assert names(pool, prompt=2000) == "a stayed"


def test_a_server_with_a_free_slot_keeps_its_conversation_even_if_slower() -> None:
    pool = [server("a", holds=10, tps=10), server("b", tps=10_000)]
    assert names(pool, prompt=10_000) == "a stayed"


def test_the_wait_grows_with_the_calls_queued_before_and_shrinks_with_the_slots() -> None:
    speeds = Speeds(prefill_tps=1000, slot_s=10)
    assert expected_seconds(server("idle", parallel=2, in_flight=1), 0, 0, speeds) == 0
    assert expected_seconds(server("full", parallel=2, in_flight=2), 0, 0, speeds) == 5
    assert expected_seconds(server("queue", parallel=2, in_flight=4), 0, 0, speeds) == 15
    assert expected_seconds(server("one", parallel=1, in_flight=1), 0, 0, speeds) == 10
    # a server's own measurements come before the pool's
    assert expected_seconds(server("own", tps=100, slot_s=1), 0, 1000, speeds) == 10


def test_a_server_not_measured_yet_is_taken_to_run_as_the_measured_ones() -> None:
    measured = server("m", tps=2000, slot_s=4)
    assert Speeds.of_pool([measured, server("new")]) == Speeds(2000, 4)
    assert Speeds.of_pool([server("new")]).prefill_tps == DEFAULT_PREFILL_TPS


def test_an_eviction_seen_in_an_answer_sends_the_next_call_elsewhere() -> None:
    a, b = server("a", holds=8000), server("b", holds=6000)
    assert names([a, b]) == "a stayed"
    assert a.reused(K, 100) == 7900  # the call found almost nothing left on a
    assert names([a, b]) == "b stayed"


def test_an_answer_moves_the_conversation_with_it() -> None:
    a, b = server("a", holds=3000), server("b")
    b.answered(K, cached=0, evaluated=4000, generated=200)
    assert names([a, b]) == "b stayed"


@pytest.mark.parametrize(
    ("pool", "expected"),
    [
        # the smallest share of slots taken
        ([server("a", parallel=4, in_flight=2), server("b", parallel=1)], "b"),
        ([server("a", parallel=4, in_flight=1), server("b", parallel=2, in_flight=1)], "a"),
        ([server("a", in_flight=1), server("b", busy_slots=1), server("c")], "c"),
        # equal shares: fewer calls
        ([server("a", parallel=4, in_flight=2), server("b", parallel=2, in_flight=1)], "b"),
    ],
)
def test_a_new_conversation_goes_to_the_least_busy_server(
    pool: list[ServerState], expected: str
) -> None:
    choice = choose(K, 1000, pool)
    assert (choice.server.name, choice.reason, choice.held_by) == (expected, "new", None)


def test_ties_between_idle_servers_spread_over_the_caches_then_go_to_the_first() -> None:
    a, b, c = server("a"), server("b"), server("c")
    assert names([a, b, c]) == "a new"
    a.answered(OTHER, 0, 500, 0)
    c.answered(("task-3", "agent_turn"), 0, 200, 0)
    assert names([a, b, c]) == "b new"
    b.answered(("task-4", "agent_turn"), 0, 200, 0)
    assert names([a, b, c]) == "b new"  # b and c hold as much: the first of them
    # and the same state always gives the same choice
    assert {names([a, b, c]) for _ in range(5)} == {"b new"}


def test_servers_holding_as_much_go_by_load_then_order() -> None:
    assert names([server("a", holds=500, in_flight=1, parallel=2), server("b", holds=500)]) == (
        "b stayed"
    )
    assert names([server("a", holds=500), server("b", holds=500)]) == "a stayed"


def test_an_unhealthy_server_is_never_chosen_and_its_conversation_fails_over() -> None:
    pool = [server("a", holds=9000, healthy=False), server("b", holds=3000), server("c")]
    choice = choose(K, 10_000, pool)
    # b holds an older part of the conversation: the best of those still up
    assert (choice.server.name, choice.reason, choice.held_by) == ("b", "failover", 0)
    assert names(pool, OTHER) == "c new"  # of the idle servers up, the one holding least
    pool[1].healthy = False
    assert names(pool) == "c failover"
    pool[0].healthy = True
    assert names(pool) == "a stayed"


def test_a_new_conversation_skips_an_idle_server_that_is_down() -> None:
    pool = [server("a", healthy=False), server("b", in_flight=1, parallel=2)]
    assert names(pool) == "b new"


def test_no_server_up_is_an_error_the_caller_answers_with_a_503() -> None:
    pool = [server("a", holds=100, healthy=False), server("b", healthy=False)]
    for policy in ("affinity", "least_busy", "round_robin"):
        with pytest.raises(NoHealthyServer, match="none of the 2 server"):
            choose(K, 100, pool, policy)


def test_round_robin_takes_each_server_that_is_up_in_turn() -> None:
    servers = [server("a", holds=5000), server("b"), server("c")]
    pool = Pool(servers, "round_robin")
    picks = [pool.choose(K, 100) for _ in range(4)]
    assert [(c.server.name, c.reason) for c in picks] == [
        ("a", "stayed"),
        ("b", "rebalanced"),
        ("c", "rebalanced"),
        ("a", "stayed"),
    ]
    servers[1].healthy = False
    assert [pool.choose(OTHER, 100).server.name for _ in range(3)] == ["c", "a", "c"]


def test_least_busy_ignores_the_caches() -> None:
    pool = [server("a", holds=5000, in_flight=1, parallel=2), server("b")]
    choice = choose(K, 6000, pool, "least_busy")
    assert (choice.server.name, choice.reason, choice.held_by) == ("b", "rebalanced", 0)
    assert choose(K, 6000, pool, "affinity").server.name == "a"


def test_a_pool_of_one_always_uses_it() -> None:
    only = server("a", in_flight=3)
    for policy in ("affinity", "least_busy", "round_robin"):
        pool = Pool([only], policy)
        assert [pool.choose(K, 100).index for _ in range(3)] == [0, 0, 0]
    with pytest.raises(ValueError, match="one server or more"):
        Pool([])


# -- properties over random pools ----------------------------------------------------


@dataclass
class Drawn:
    servers: list[ServerState]
    prompt: int


@st.composite
def pools(draw: st.DrawFn, min_healthy: int = 0) -> Drawn:
    count = draw(st.integers(1, 5))
    servers = []
    for i in range(count):
        s = ServerState(
            f"s{i}", draw(st.integers(1, 4)), healthy=i < min_healthy or draw(st.booleans())
        )
        held = draw(st.integers(0, 60_000))
        if held:
            s.holdings.answered(K, 0, held, 0)
        if draw(st.booleans()):
            s.holdings.answered(OTHER, 0, draw(st.integers(1, 60_000)), 0)
        for _ in range(draw(st.integers(0, 6))):
            s.call_started()
        s.slots_read(draw(st.none() | st.integers(0, 6)))
        if draw(st.booleans()):
            prompt_ms = draw(st.floats(10, 100_000))
            slot_ms = draw(st.none() | st.floats(1, 100_000))
            s.measured(draw(st.integers(64, 100_000)), prompt_ms, slot_ms)
        servers.append(s)
    return Drawn(draw(st.permutations(servers)), draw(st.integers(0, 70_000)))


POLICIES = st.sampled_from(["affinity", "least_busy", "round_robin"])


@given(pools(), POLICIES, st.integers(0, 10))
def test_never_an_unhealthy_server(drawn: Drawn, policy: Routing, turn: int) -> None:
    if not any(s.healthy for s in drawn.servers):
        with pytest.raises(NoHealthyServer):
            choose(K, drawn.prompt, drawn.servers, policy, turn=turn)
        return
    choice = choose(K, drawn.prompt, drawn.servers, policy, turn=turn)
    assert choice.server.healthy
    assert choice.server is drawn.servers[choice.index]
    # the reason agrees with where the conversation was
    holder = choice.held_by
    if holder is None:
        assert choice.reason == "new"
        assert all(s.holdings.expected(K) == 0 for s in drawn.servers)
    else:
        assert drawn.servers[holder].holdings.expected(K) == max(
            s.holdings.expected(K) for s in drawn.servers
        )
        expected = (
            "failover"
            if not drawn.servers[holder].healthy
            else "stayed"
            if holder == choice.index
            else "rebalanced"
        )
        assert choice.reason == expected


@given(pools(), POLICIES, st.integers(0, 4))
def test_with_one_server_up_always_that_one(drawn: Drawn, policy: Routing, up: int) -> None:
    up %= len(drawn.servers)
    for i, s in enumerate(drawn.servers):
        s.healthy = i == up
    assert choose(K, drawn.prompt, drawn.servers, policy).index == up


@given(pools(min_healthy=1))
def test_affinity_takes_fewer_cached_tokens_only_for_a_faster_server(drawn: Drawn) -> None:
    servers, prompt = drawn.servers, drawn.prompt
    choice = choose(K, prompt, servers)
    speeds = Speeds.of_pool(servers)
    chosen_s = expected_seconds(choice.server, choice.cached_tokens, prompt, speeds)
    assert choice.cached_tokens == expected_cached(choice.server, K, prompt)
    for s in servers:
        cached = expected_cached(s, K, prompt)
        if s.healthy and cached > choice.cached_tokens:
            assert chosen_s < expected_seconds(s, cached, prompt, speeds)


@given(pools(min_healthy=1))
def test_a_holder_up_with_a_free_slot_always_keeps_its_conversation(drawn: Drawn) -> None:
    choice = choose(K, drawn.prompt, drawn.servers)
    holder = None if choice.held_by is None else drawn.servers[choice.held_by]
    if holder is not None and holder.healthy and not holder.busy:
        assert (choice.server, choice.reason) == (holder, "stayed")
