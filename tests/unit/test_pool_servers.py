"""A pool's servers as the gateway sees them: what each cache is expected to hold, how busy
and how fast each server is."""

from __future__ import annotations

import pytest

from boundedcode_gateway.pools.holdings import CacheHoldings
from boundedcode_gateway.pools.server_state import MIN_PREFILL_SAMPLE_TOKENS, ServerState

A = ("task-a", "agent_turn")
B = ("task-b", "agent_turn")
C = ("task-c", "agent_turn")


def test_an_answer_leaves_its_whole_prompt_and_what_it_generated() -> None:
    held = CacheHoldings()
    assert held.expected(A) == 0
    held.answered(A, cached=0, evaluated=1200, generated=300)
    assert held.expected(A) == 1500
    # the next turn found the first 1500 and added 400 of its own, then 250 generated
    held.answered(A, cached=1500, evaluated=400, generated=250)
    assert held.expected(A) == 2150
    assert held.expected(B) == 0
    assert held.total_tokens == 2150


def test_a_call_that_found_less_than_expected_brings_the_estimate_down() -> None:
    held = CacheHoldings()
    held.answered(A, cached=0, evaluated=8000, generated=500)
    # another conversation took the slot: only the system prompt was still there
    assert held.reused(A, cached=600) == 7900
    assert held.expected(A) == 600
    assert held.total_tokens == 600
    # finding as much as expected, or more, changes nothing
    assert held.reused(A, cached=600) == 0
    assert held.reused(A, cached=900) == 0
    assert held.expected(A) == 600
    # a conversation the server was not known to hold is not learnt from a reuse
    assert held.reused(B, cached=300) == 0
    assert held.expected(B) == 0 and len(held) == 1
    # nothing found: the server holds none of it
    assert held.reused(A, cached=0) == 600
    assert len(held) == 0 and held.total_tokens == 0


def test_the_least_recently_answered_conversation_is_forgotten_first() -> None:
    held = CacheHoldings(max_conversations=2)
    held.answered(A, 0, 100, 10)
    held.answered(B, 0, 200, 20)
    assert held.expected(A) == 110  # reading it does not make it recent
    held.answered(C, 0, 300, 30)
    assert (held.expected(A), held.expected(B), held.expected(C)) == (0, 220, 330)
    held.answered(B, 220, 10, 10)  # B answered again: C is now the oldest
    held.answered(A, 0, 50, 5)
    assert (held.expected(A), held.expected(B), held.expected(C)) == (55, 240, 0)


def test_a_token_limit_forgets_the_oldest_until_the_rest_fit() -> None:
    held = CacheHoldings(max_tokens=1000)
    held.answered(A, 0, 400, 0)
    held.answered(B, 0, 400, 0)
    held.answered(C, 0, 300, 0)
    assert (held.expected(A), held.expected(B), held.expected(C)) == (0, 400, 300)
    assert held.total_tokens == 700
    # a conversation larger than the limit is kept alone
    held.answered(A, 0, 5000, 0)
    assert (held.expected(A), held.expected(B), held.expected(C)) == (5000, 0, 0)


def test_a_restart_empties_the_cache_and_the_slots_but_keeps_the_speed() -> None:
    server = ServerState("s", parallel=2)
    server.answered(A, 0, 4000, 100, prompt_ms=2000.0, slot_ms=5000.0)
    server.slots_read(2)
    assert server.busy
    server.restarted()
    assert server.holdings.expected(A) == 0 and len(server.holdings) == 0
    assert server.busy_slots is None and not server.busy
    assert server.prefill_tps == 2000.0 and server.slot_s == 5.0
    # the table goes on after a restart
    server.answered(A, 0, 10, 1)
    assert server.holdings.expected(A) == 11


def test_prefill_speed_is_a_moving_average_of_long_enough_prompts() -> None:
    server = ServerState("s")
    assert server.prefill_tps is None and server.slot_s is None
    server.measured(MIN_PREFILL_SAMPLE_TOKENS - 1, prompt_ms=1.0)  # too short to tell
    server.measured(1000, prompt_ms=None)
    server.measured(1000, prompt_ms=0.0)
    assert server.prefill_tps is None
    server.measured(1000, prompt_ms=1000.0, slot_ms=4000.0)
    assert server.prefill_tps == 1000.0 and server.slot_s == 4.0
    server.measured(2000, prompt_ms=1000.0, slot_ms=8000.0)
    # a quarter of the way to each new measurement
    assert server.prefill_tps == 1250.0 and server.slot_s == 5.0


def test_load_is_the_calls_in_flight_and_the_other_clients_busy_slots() -> None:
    server = ServerState("s", parallel=2)
    assert (server.load, server.busy) == (0, False)
    server.call_started()
    assert (server.load, server.busy) == (1, False)
    server.slots_read(2)  # another client, or a cache repair, took the other slot
    assert (server.load, server.busy) == (2, True)
    server.slots_read(0)
    assert (server.load, server.busy) == (1, False)
    server.call_started()
    assert (server.load, server.busy) == (2, True)
    server.slots_read(None)  # unreadable: the gateway's own count alone
    server.call_ended()
    server.call_ended()
    server.call_ended()  # one end too many never goes below zero
    assert (server.in_flight, server.load) == (0, 0)


def test_a_reading_taken_during_the_gateways_own_call_is_not_load_once_it_ended() -> None:
    server = ServerState("s", parallel=1)
    server.call_started()
    server.slots_read(1)  # the gateway's own call, processing
    assert server.busy
    server.call_ended()
    # the reading is up to a second old: the call it counted has ended
    assert (server.busy_slots, server.load, server.busy) == (1, 0, False)


def test_the_gateways_background_work_is_not_load() -> None:
    server = ServerState("s", parallel=1)
    with server.working():
        server.slots_read(1)  # a cache repair, which gives way to the next call
        assert (server.load, server.busy) == (0, False)
        server.slots_read(2)  # and another client's call beside it
        assert (server.load, server.busy) == (1, True)
    assert server.background == 0
    server.restarted()
    assert (server.busy_slots, server.load) == (None, 0)


def test_a_server_has_a_slot() -> None:
    with pytest.raises(ValueError, match="one slot or more"):
        ServerState("s", parallel=0)
