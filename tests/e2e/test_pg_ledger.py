"""A gateway with ``ledger: postgresql://…``: every call it served is exactly one row, the
same as its call-log line, also across the database going away and coming back; a second
gateway on the same ledger reads the budgets' spending back from it."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from boundedcode_gateway.budgets.shared import SharedBudgets
from boundedcode_gateway.metering.records import LEDGER_FIELDS
from tests.e2e.conftest import GatewayFactory, Upstreams
from tests.fakes.common import Reply
from tests.fakes.tcp_proxy import TcpProxy
from tests.postgres_db import SERVER_PORT, PgDatabase

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]


def test_every_call_is_exactly_one_row(
    pg: PgDatabase, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(upstreams.profiles, ledger=pg.url)
    upstreams.llama.queue(*(Reply(content=f"Hello {n}.") for n in range(4)))
    upstreams.openai.queue(Reply(content="Hello from the cloud."))
    client = gateway.client(task="pg-task")
    for _ in range(2):
        client.chat.completions.create(model="local", messages=HELLO)
    for _ in range(2):
        list(client.chat.completions.create(model="local", messages=HELLO, stream=True))
    client.chat.completions.create(model="gpt", messages=HELLO)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="absent", messages=HELLO)

    logged = gateway.calls()
    rows = pg.fetch(f"SELECT {', '.join(LEDGER_FIELDS)} FROM model_calls ORDER BY seq")
    assert len(logged) == 6
    assert sorted(r["call_id"] for r in rows) == sorted(c["call_id"] for c in logged)
    by_id = {c["call_id"]: c for c in logged}
    for row in rows:
        line = by_id[row["call_id"]]
        assert row == {name: line[name] for name in LEDGER_FIELDS}
    assert [r["http_status"] for r in rows].count(404) == 1
    assert gateway.app.writer.errors == 0


def test_a_restarted_gateway_finds_the_spending_in_postgresql(
    pg: PgDatabase, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    settings = {"ledger": pg.url, "budgets": {"task": {"max_tokens": 10**9, "per": "lifetime"}}}
    first = start_gateway(upstreams.profiles, **settings)
    upstreams.llama.queue(Reply(content="Hello."), Reply(content="Again."))
    client = first.client(task="budgeted")
    for _ in range(2):
        client.chat.completions.create(model="local", messages=HELLO)
    logged = first.calls()
    spent_tokens = sum(c["prompt_tokens"] + c["completion_tokens"] for c in logged)
    first.stop()

    second = start_gateway(upstreams.profiles, **settings)
    shared = second.app.budgets
    assert isinstance(shared, SharedBudgets) and second.app.loop is not None
    found = asyncio.run_coroutine_threadsafe(shared.state(("task", "budgeted")), second.app.loop)
    held = found.result(10)
    assert held.lifetime.tokens == held.day.tokens == spent_tokens > 0
    assert held.reserved.tokens == 0  # every call's row is in: nothing held


def test_calls_go_on_while_the_database_is_away_and_each_is_one_row_once_back(
    pg: PgDatabase, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    proxy = TcpProxy(target_port=SERVER_PORT).start()
    try:
        # sync: each answer waits for its record, and still not for a database that is away
        gateway = start_gateway(
            upstreams.profiles, ledger=pg.url_at(proxy.port), metering={"sync": True}
        )
        upstreams.llama.queue(*(Reply(content=f"Hello {n}.") for n in range(6)))
        client = gateway.client(task="outage")
        client.chat.completions.create(model="local", messages=HELLO)
        proxy.cut()
        for _ in range(2):
            started = time.monotonic()
            client.chat.completions.create(model="local", messages=HELLO)
            list(client.chat.completions.create(model="local", messages=HELLO, stream=True))
            assert time.monotonic() - started < 10.0
        writer = gateway.app.writer
        assert writer.ledger_buffered == 4
        assert len(gateway.calls()) == 5  # the call log is written throughout
        proxy.restore()
        deadline = time.monotonic() + 40.0
        while writer.ledger_buffered:
            assert time.monotonic() < deadline, "the kept records were not written"
            time.sleep(0.05)
        client.chat.completions.create(model="local", messages=HELLO)
        logged = [c["call_id"] for c in gateway.calls()]
        rows = [r["call_id"] for r in pg.fetch("SELECT call_id FROM model_calls ORDER BY seq")]
        assert rows == logged  # each call once, in the order the call log has them
        assert len(rows) == 6
        assert writer.ledger_dropped == 0
    finally:
        proxy.stop()
