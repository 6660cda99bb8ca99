"""A gateway with ``ledger: postgresql://…``: every call it served is exactly one row, the
same as its call-log line; a second gateway on the same ledger reads the budgets' spending
back from it."""

from __future__ import annotations

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from boundedcode_gateway.metering.records import LEDGER_FIELDS
from tests.e2e.conftest import GatewayFactory, Upstreams
from tests.fakes.common import Reply
from tests.postgres_db import PgDatabase

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


def test_a_restarted_gateway_reads_the_spending_back_from_postgresql(
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
    book = second.app.budgets
    assert book is not None
    assert book.spent(("task", "budgeted"), "lifetime", "").tokens == spent_tokens > 0
