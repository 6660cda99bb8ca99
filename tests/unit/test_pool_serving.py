"""The pool as the calls use it (llama_server/pool.py): a lease chooses once and holds a
slot until the call ends; a failed server is probed and left once; an answer's timings
move what the server is expected to hold; a probe reads health and busy slots; servers
that disagree on ``/props`` stop the start."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from boundedcode_gateway.errors import ConfigError, UpstreamUnavailable
from boundedcode_gateway.llama_server.pool import PoolMember, ServerPool
from boundedcode_gateway.pools.server_state import ServerState
from boundedcode_gateway.upstream.http import HttpClient, Timeouts
from boundedcode_gateway.upstream.metrics import CallMetrics
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import RunningServer, serve_in_thread, stop_all

KEY = ("task", "agent_turn")


@pytest.fixture
def fakes() -> Iterator[tuple[list[FakeLlamaServer], list[RunningServer]]]:
    made = [FakeLlamaServer(total_slots=2) for _ in range(2)]
    running = [serve_in_thread(f.app) for f in made]
    yield made, running
    stop_all(running)


def pool_of(urls: list[str], policy: Any = "affinity") -> ServerPool:
    members = [PoolMember(ServerState(u, 2), u) for u in urls]
    return ServerPool("p", members, policy, HttpClient(Timeouts(2.0, 2.0)), dict)


def run(pool: ServerPool, work: Callable[[], Awaitable[None]]) -> None:
    """``work`` on an event loop of its own, the pool's connections closed after it."""

    async def then_close() -> None:
        try:
            await work()
        finally:
            await pool.http.close()

    asyncio.run(then_close())


def metrics(prompt: int, cached: int, completion: int) -> CallMetrics:
    m = CallMetrics()
    m.prompt_tokens, m.cached_tokens, m.completion_tokens = prompt, cached, completion
    m.evaluated_tokens = prompt - cached
    m.prefill_ms, m.decode_ms = 100.0, 50.0
    return m


def test_a_lease_chooses_once_and_holds_a_slot_until_released() -> None:
    pool = pool_of(["http://a", "http://b"])
    lease = pool.lease(KEY)
    assert (lease.server, lease.reason) == (None, None)
    assert lease.root(400) == "http://a"
    assert lease.root(99_999) == "http://a"  # chosen once, whatever is asked after
    chosen: tuple[str | None, str | None] = (lease.server, lease.reason)
    assert chosen == ("http://a", "new")
    assert [m.state.in_flight for m in pool.members] == [1, 0]
    # a second call of another conversation goes to the idle server
    other = pool.lease(("other", "agent_turn"))
    assert other.root(400) == "http://b"
    lease.release()
    lease.release()  # once only
    assert [m.state.in_flight for m in pool.members] == [0, 1]
    assert lease.server == "http://a"  # the record still names it


def test_an_answer_makes_its_server_the_conversations_home() -> None:
    pool = pool_of(["http://a", "http://b"])
    first = pool.lease(KEY)
    first.root(400)
    # the other server is busier now, then the answer lands on the first
    pool.members[1].state.call_started()
    first.answered(metrics(prompt=120, cached=0, completion=30))
    first.release()
    assert pool.members[0].state.holdings.expected(KEY) == 150
    assert pool.members[0].state.prefill_tps == pytest.approx(1200.0)
    assert pool.members[0].state.slot_s == pytest.approx(0.15)
    pool.members[1].state.call_ended()
    again = pool.lease(KEY)
    assert again.root(800) == "http://a"
    assert again.reason == "stayed" and again.moved is None


def test_a_pool_of_one_never_routes_nor_moves() -> None:
    pool = pool_of(["http://only"])
    pool.members[0].state.healthy = False  # never probed: a pool of one is not left
    lease = pool.lease(KEY)
    assert lease.root(10) == "http://only"

    async def work() -> None:
        assert await lease.moved_root() is None

    run(pool, work)


def test_no_server_up_is_a_503() -> None:
    pool = pool_of(["http://a", "http://b"])
    for member in pool.members:
        member.state.healthy = False
    with pytest.raises(UpstreamUnavailable, match="none of the 2 server"):
        pool.lease(KEY).root(10)


def test_a_dead_server_is_left_once_for_one_that_is_up(
    fakes: tuple[list[FakeLlamaServer], list[RunningServer]],
) -> None:
    _, running = fakes
    dead = "http://127.0.0.1:1"  # nothing listens there
    pool = pool_of([dead, running[0].url, running[1].url])

    async def work() -> None:
        lease = pool.lease(KEY)
        pool.members[0].state.answered(KEY, 0, 100, 10)  # the conversation's home
        assert lease.root(400) == dead
        root = await lease.moved_root()
        assert root == running[0].url
        assert lease.moved == "failover"
        assert not pool.members[0].state.healthy
        assert [m.state.in_flight for m in pool.members] == [0, 1, 0]
        # once per call
        assert await lease.moved_root() is None

    run(pool, work)


def test_a_server_that_is_up_is_not_left_after_a_failed_answer(
    fakes: tuple[list[FakeLlamaServer], list[RunningServer]],
) -> None:
    _, running = fakes
    pool = pool_of([r.url for r in running])

    async def work() -> None:
        lease = pool.lease(KEY)
        lease.root(10)
        assert await lease.moved_root() is None
        assert lease.reason == "new" and lease.moved is None

    run(pool, work)


def test_a_probe_reads_health_and_busy_slots_and_a_server_back_starts_empty(
    fakes: tuple[list[FakeLlamaServer], list[RunningServer]],
) -> None:
    made, running = fakes
    pool = pool_of([running[0].url, "http://127.0.0.1:1"])
    up, down = pool.members
    made[0].busy_elsewhere = True

    async def work() -> None:
        assert await pool.probe(up)
        assert (up.state.busy_slots, up.state.parallel, up.state.busy) == (2, 2, True)
        down.state.answered(KEY, 0, 500, 20)
        assert not await pool.probe(down)
        assert down.state.busy_slots is None
        # it answers again: what it held before is not counted on
        down.url = running[1].url
        assert await pool.probe(down)
        assert down.state.healthy and down.state.holdings.expected(KEY) == 0

    run(pool, work)


def test_servers_that_disagree_on_props_stop_the_start(
    fakes: tuple[list[FakeLlamaServer], list[RunningServer]],
) -> None:
    made, running = fakes
    made[1].n_ctx = 8192
    pool = pool_of([r.url for r in running])

    async def work() -> None:
        with pytest.raises(ConfigError, match=r"models\.p: .*differ\(s\) from .*context size"):
            await pool.start()
        made[1].n_ctx = made[0].n_ctx
        await pool.start()
        assert pool.routing.servers[0].healthy
        await pool.close()

    run(pool, work)
