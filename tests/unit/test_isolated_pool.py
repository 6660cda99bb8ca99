"""A pool under cache isolation (llama_server/pool.py, cache_keeper.py) against the fake
llama-server: each call's request names a slot of its group, a slot is erased before it
serves another group, an erase that fails sends nothing, and the cache keeper repairs in
the answer's own slot or not at all."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from boundedcode_gateway.errors import UpstreamUnavailable
from boundedcode_gateway.llama_server.cache_keeper import AnsweredCall, CacheKeeper
from boundedcode_gateway.llama_server.pool import PoolMember, ServerLease, ServerPool
from boundedcode_gateway.llama_server.slots import SlotTable
from boundedcode_gateway.metering.bus import RecordBus
from boundedcode_gateway.metering.writer import MeterWriter
from boundedcode_gateway.policy.cache_misses import PreviousCall
from boundedcode_gateway.pools.server_state import ServerState
from boundedcode_gateway.upstream.http import HttpClient, Timeouts, read_body
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import RunningServer, serve_in_thread

MESSAGES = [{"role": "system", "content": "Keep the code 7341."}, {"role": "user", "content": "Hi"}]


@pytest.fixture
def fake() -> Iterator[tuple[FakeLlamaServer, RunningServer]]:
    server = FakeLlamaServer(total_slots=2)
    running = serve_in_thread(server.app)
    yield server, running
    running.stop()


def _pool(url: str, slots: int = 2) -> ServerPool:
    member = PoolMember(ServerState(url, slots), url, slots=SlotTable(slots))
    return ServerPool("p", [member], "affinity", HttpClient(Timeouts(2.0, 2.0)), dict)


def _body(**extra: Any) -> bytes:
    return orjson.dumps({"messages": MESSAGES, "max_tokens": 4, **extra})


async def _send(pool: ServerPool, lease: ServerLease) -> tuple[bytes, dict[str, Any]]:
    """One call of ``lease``'s group, pinned as the attempts pin it."""
    url = lease.root(100) + "/v1/chat/completions"
    body = await lease.pinned(_body())
    headers = {"Content-Type": "application/json"}
    resp = await pool.http.send("POST", url, headers, body, resend_safe=True)
    answer: dict[str, Any] = orjson.loads(await read_body(resp))
    return body, answer


def test_each_group_runs_in_its_own_slot_and_a_slot_is_erased_before_it_changes_group(
    fake: tuple[FakeLlamaServer, RunningServer],
) -> None:
    server, running = fake

    async def scenario() -> None:
        pool = _pool(running.url)
        try:
            a = pool.lease(("a", "agent_turn"), "task:a")
            sent, _ = await _send(pool, a)
            assert orjson.loads(sent)["id_slot"] == 0 and server.erased == [0]
            a.release()
            b = pool.lease(("b", "agent_turn"), "task:b")
            sent, guess = await _send(pool, b)
            # task B sent A's very prompt, in a slot of its own: nothing of A's was there
            assert orjson.loads(sent)["id_slot"] == 1 and server.erased == [0, 1]
            assert guess["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            b.release()
            again = pool.lease(("a", "agent_turn"), "task:a")
            sent, own = await _send(pool, again)
            assert orjson.loads(sent)["id_slot"] == 0 and server.erased == [0, 1]
            assert own["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            again.release()
            c = pool.lease(("c", "agent_turn"), "task:c")
            sent, other = await _send(pool, c)
            # the least recently used slot, B's, erased before C's call
            assert orjson.loads(sent)["id_slot"] == 1 and server.erased == [0, 1, 1]
            assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            c.release()
        finally:
            await pool.http.close()

    asyncio.run(scenario())


def test_a_slot_the_server_would_not_erase_takes_no_call(
    fake: tuple[FakeLlamaServer, RunningServer],
) -> None:
    server, running = fake
    server.slot_actions = False  # started without --slot-save-path

    async def scenario() -> None:
        pool = _pool(running.url)
        try:
            lease = pool.lease(("a", "agent_turn"), "task:a")
            lease.root(100)
            with pytest.raises(UpstreamUnavailable, match="did not empty slot 0"):
                await lease.pinned(_body())
            lease.release()
            assert not server.requests.bodies("/v1/chat/completions")
            # the slot is free again, and will be erased before its next use
            table = pool.members[0].slots
            assert table is not None and not table.in_use(0) and table.owner(0) is None
        finally:
            await pool.http.close()

    asyncio.run(scenario())


def test_without_isolation_a_request_goes_as_it_was(
    fake: tuple[FakeLlamaServer, RunningServer],
) -> None:
    _, running = fake

    async def scenario() -> None:
        member = PoolMember(ServerState(running.url, 2), running.url)
        pool = ServerPool("p", [member], "affinity", HttpClient(Timeouts(2.0, 2.0)), dict)
        lease = pool.lease(("a", "agent_turn"))
        lease.root(100)
        body = _body(id_slot=1)
        assert await lease.pinned(body) is body and lease.slot is None
        await pool.http.close()

    asyncio.run(scenario())


def _answered(lease: ServerLease, root: str, body: bytes, answer: dict[str, Any]) -> AnsweredCall:
    message = answer["choices"][0]["message"]
    return AnsweredCall(
        "a",
        "agent_turn",
        "p",
        root,
        None,
        body,
        {"role": "assistant", "content": message.get("content") or ""},
        False,
        False,
        PreviousCall(answer["usage"]["prompt_tokens"], 4, len(MESSAGES)),
        lease.slot,
    )


def test_the_keeper_repairs_in_the_answers_slot_or_not_at_all(
    fake: tuple[FakeLlamaServer, RunningServer], tmp_path: Path
) -> None:
    server, running = fake

    async def scenario() -> None:
        pool = _pool(running.url, slots=1)
        writer = MeterWriter(tmp_path / "calls.jsonl", tmp_path / "ledger.db", enabled=False)
        bus = RecordBus(writer)
        keeper = CacheKeeper("p", pool.api, True, bus)
        try:
            a = pool.lease(("a", "agent_turn"), "task:a")
            body, answer = await _send(pool, a)
            # handed over as the call's flow does: at the answer, before the call ends
            call = _answered(a, running.url, body, answer)
            a.release()
            keeper.answered(call)
            await _until_done(keeper)
            repairs = server.cache_requests.bodies("/completion")
            assert [r.get("id_slot") for r in repairs] == [0]

            # the next answer's slot goes to task B before its repair can run
            again = pool.lease(("a", "agent_turn"), "task:a")
            body, answer = await _send(pool, again)
            call = _answered(again, running.url, body, answer)
            again.release()
            b = pool.lease(("b", "agent_turn"), "task:b")
            await _send(pool, b)
            keeper.answered(call)
            await _until_done(keeper)
            assert len(server.cache_requests.bodies("/completion")) == 1  # none into B's
            b.release()
        finally:
            await keeper.close()
            await pool.http.close()

    asyncio.run(scenario())


async def _until_done(keeper: CacheKeeper) -> None:
    for _ in range(500):
        if not keeper.pending:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the keeper's follow-up did not end")
