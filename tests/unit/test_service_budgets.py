"""``service.py`` with prices and budgets: each record priced with its profile's price, a
call over its budget refused before its upstream and recorded with its caller, and every
record counted in the book."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from boundedcode_gateway.budgets.book import BudgetBook
from boundedcode_gateway.call_context import CallContext, Caller
from boundedcode_gateway.config import BudgetSettings, PriceSettings, parse_config
from boundedcode_gateway.errors import BudgetExceeded, ModelNotFound
from boundedcode_gateway.live_config import LiveConfig, Route
from boundedcode_gateway.providers.registry import REASONING_FILES
from boundedcode_gateway.reasoning_store.store import ReasoningStore
from boundedcode_gateway.service import GatewayService
from boundedcode_gateway.upstream.http import HttpClient, Timeouts
from tests.unit.scripted_http import (
    RecordingWriter,
    ScriptedServer,
    completion,
    json_answer,
    openai_upstream,
)

PRICE = PriceSettings(input_per_mtok=2.0, output_per_mtok=8.0)
ASK: list[Any] = [{"role": "user", "content": "hi"}]
# the scripted completion reports 3 prompt and 2 completion tokens
CALL_TOKENS = 5


@dataclass
class Priced:
    service: GatewayService
    server: ScriptedServer
    writer: RecordingWriter
    book: BudgetBook

    async def chat(self, who: Caller | None, model: str = "gpt", task: str = "t") -> None:
        ctx = CallContext.new(task, "agent_turn", caller=who)
        await self.service.chat(ctx, {"model": model, "messages": ASK})


@pytest.fixture
async def priced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Priced]:
    server = ScriptedServer()
    await server.start()
    http = HttpClient(Timeouts(connect_s=5.0, read_s=5.0))
    writer = RecordingWriter()
    upstream = openai_upstream(server.url, http, monkeypatch)
    book = BudgetBook(None, lambda: datetime.now(UTC))
    config = parse_config(
        f"data_dir: {tmp_path}\nmodels: {{gpt: {{provider: local, external_url: {server.url},"
        " price: {input_per_mtok: 2.0, output_per_mtok: 8.0}}}"
    )
    assert config.models["gpt"].price == PRICE
    live = LiveConfig(config, {"gpt": Route("gpt", upstream, ())})
    service = GatewayService(
        live, http, writer, ReasoningStore(tmp_path, REASONING_FILES), budgets=book
    )
    yield Priced(service, server, writer, book)
    await service.close()
    await http.close()
    await server.stop()


def key(name: str, max_tokens: int) -> Caller:
    return Caller(name, "key", frozenset({"gpt"}), budget=BudgetSettings(max_tokens=max_tokens))


async def test_a_call_is_priced_with_its_profiles_price_and_counted(priced: Priced) -> None:
    priced.server.queue(json_answer(200, completion("fine")))
    await priced.chat(key("ci", 100))
    [record] = priced.writer.records
    assert record.caller == "ci"
    assert record.cost_usd == pytest.approx((3 * 2.0 + 2 * 8.0) / 1e6)
    spent = priced.book.spent(("caller", "ci"), "day", priced.book.today())
    assert (spent.tokens, spent.cost_usd) == (CALL_TOKENS, record.cost_usd)


async def test_a_call_over_budget_is_refused_before_its_upstream_and_recorded(
    priced: Priced,
) -> None:
    priced.server.queue(json_answer(200, completion("fine")))
    who = key("ci", CALL_TOKENS)
    await priced.chat(who)
    with pytest.raises(BudgetExceeded) as refused:
        await priced.chat(who)
    assert "caller 'ci' has spent 5 tokens of its max_tokens budget of 5 tokens" in str(
        refused.value.message
    )
    assert len(priced.server.seen) == 1  # the refused call never reached the upstream
    _, record = priced.writer.records
    assert (record.status, record.http_status, record.error_code) == (
        "error",
        429,
        "budget_exceeded",
    )
    assert (record.caller, record.attempts, record.cost_usd) == ("ci", 0, None)
    # another caller with its own budget is served
    priced.server.queue(json_answer(200, completion("fine")))
    await priced.chat(key("other", CALL_TOKENS))


async def test_an_unknown_model_is_a_404_even_with_the_budget_spent(priced: Priced) -> None:
    priced.server.queue(json_answer(200, completion("fine")))
    who = key("ci", CALL_TOKENS)
    await priced.chat(who)
    with pytest.raises(ModelNotFound):
        await priced.chat(who, model="nobody")
    assert priced.writer.records[-1].error_code == "model_not_found"
