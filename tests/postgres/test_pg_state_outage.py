"""A state database that goes away, or stops answering: at start the gateway refuses to
serve; while serving, no operation of a call waits longer than its timeout, a call goes on
with what its gateway holds, the outage is counted and logged once, and the database is
used again once back. The database is cut off by a TCP proxy of the test's own
(tests/fakes/tcp_proxy.py), or made to hold a statement by a lock another session holds."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from boundedcode_gateway.app import GatewayApp
from boundedcode_gateway.config import parse_config
from boundedcode_gateway.database.pool import RETRY_AFTER_S, STATEMENT_TIMEOUT_S
from boundedcode_gateway.metering.writer import MeterWriter
from boundedcode_gateway.operations.metrics import PREFIX, GatewayMetrics
from boundedcode_gateway.policy.history_diff import GREW_ONLY
from boundedcode_gateway.state.database import load_state_migrations
from tests.fakes.tcp_proxy import TcpProxy
from tests.lifespan import startup_report
from tests.postgres.test_pg_ledger import closed_port
from tests.postgres.test_pg_state import Gateway, as_messages, closed, opened
from tests.postgres_db import PgDatabase
from tests.unit.test_metrics import Table

T = TypeVar("T")
KIND = "reasoning_content"
# an operation's timeout, and the time a loaded machine may add to it
BOUND_S = STATEMENT_TIMEOUT_S + 1.5
STATE_LOGGER = "boundedcode_gateway.database.pool"


@pytest.fixture
async def through_proxy(
    pg: PgDatabase, pg_proxy: TcpProxy
) -> AsyncIterator[tuple[Gateway, Gateway]]:
    """A gateway whose database is behind the proxy, and one that reaches it directly."""
    cut_off, direct = await opened(pg.url_at(pg_proxy.port), pg.url)
    yield cut_off, direct
    await closed([cut_off, direct])


async def timed(work: Coroutine[Any, Any, T]) -> tuple[T, float]:
    started = time.monotonic()
    result = await work
    return result, time.monotonic() - started


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == STATE_LOGGER]


async def test_a_cut_database_holds_no_call_up_and_is_used_again_once_back(
    through_proxy: tuple[Gateway, Gateway], pg_proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    gw, other = through_proxy
    await gw.keep("t", KIND, ["text:1"], "before the cut")
    assert await gw.history.changed("t", "agent_turn", as_messages(["s"])) == GREW_ONLY

    pg_proxy.cut()
    with caplog.at_level(logging.WARNING, logger=STATE_LOGGER):
        call, took = await timed(gw.reasoning.task("t"))
        assert took < BOUND_S
        # the call goes on with what this gateway holds
        found = call.find(KIND, ["text:1"])
        assert found is not None and found.data == "before the cut"
        call.keep(KIND, ["text:2"], "local", "qwen", "during the cut")
        _, took = await timed(call.saved())
        assert took < BOUND_S
        changed, took = await timed(gw.history.changed("t", "agent_turn", as_messages(["s", "u"])))
        assert changed is None and took < BOUND_S  # not known, rather than guessed
        assert not gw.db.up
        # the next calls do not try the database for a while: no wait at all
        for _ in range(3):
            _, took = await timed(gw.reasoning.task("t"))
            assert took < 0.1
        assert await gw.find("t", KIND, "text:2") == "during the cut"  # held here
        assert await other.find("t", KIND, "text:2") is None  # never reached the database
        unavailable = dict(gw.db.unavailable)
        assert unavailable["read_reasoning"] >= 4
        assert unavailable["write_reasoning"] == 1
        assert unavailable["history"] == 1
        lines = outage_lines(caplog)
        assert len(lines) == 1 and "unavailable" in lines[0]  # once per outage
        assert f"127.0.0.1:{pg_proxy.port}" in lines[0]

        pg_proxy.restore()
        await asyncio.sleep(RETRY_AFTER_S + 0.1)
        changed = await gw.history.changed("t", "agent_turn", as_messages(["s", "u", "a"]))
        assert changed == GREW_ONLY  # against the last request the database took
        assert gw.db.up
        lines = outage_lines(caplog)
        assert len(lines) == 2 and "is back" in lines[1]
    await gw.keep("t", KIND, ["text:3"], "after the cut")
    assert await other.find("t", KIND, "text:3") == "after the cut"
    assert await other.find("t", KIND, "text:1") == "before the cut"


async def test_a_database_that_does_not_answer_is_waited_for_no_longer_than_the_timeout(
    pg: PgDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    [gw] = await opened(pg.url)
    try:
        await gw.keep("t", KIND, ["text:1"], "one")
        await gw.history.changed("t", "agent_turn", as_messages(["s"]))
        # another session holds the task's rows: the statements wait on them, unanswered
        holder = await asyncpg.connect(pg.url)
        try:
            await holder.execute("BEGIN")
            await holder.execute("SELECT * FROM state_tasks FOR UPDATE")
            await holder.execute("SELECT * FROM state_history FOR UPDATE")
            with caplog.at_level(logging.WARNING, logger=STATE_LOGGER):
                call = await gw.reasoning.task("t")
                call.keep(KIND, ["text:2"], "local", "qwen", "two")
                _, took = await timed(call.saved())
                assert STATEMENT_TIMEOUT_S - 0.1 < took < BOUND_S
                assert gw.db.unavailable["write_reasoning"] == 1
                assert "TimeoutError" in outage_lines(caplog)[0]
                # for a while after, calls do not try it: one call waited, not every one
                changed, took = await timed(
                    gw.history.changed("t", "agent_turn", as_messages(["s", "u"]))
                )
                assert changed is None and took < 0.1
                await asyncio.sleep(RETRY_AFTER_S + 0.1)
                changed, took = await timed(
                    gw.history.changed("t", "agent_turn", as_messages(["s", "u"]))
                )
                assert changed is None and STATEMENT_TIMEOUT_S - 0.1 < took < BOUND_S
        finally:
            await holder.close()  # its transaction ends with it
        await asyncio.sleep(RETRY_AFTER_S + 0.1)
        # the pool's connections were given back clean: the database is used again
        assert await gw.history.changed("t", "agent_turn", as_messages(["s", "u"])) == GREW_ONLY
        await gw.keep("t", KIND, ["text:3"], "three")
        rows = pg.fetch("SELECT keys FROM state_reasoning ORDER BY seq")
        assert [r["keys"] for r in rows] == [["text:1"], ["text:3"]]
        assert gw.db.up
    finally:
        await closed([gw])


async def test_the_metrics_show_the_outage(
    through_proxy: tuple[Gateway, Gateway], pg_proxy: TcpProxy, tmp_path: Path
) -> None:
    gw, _ = through_proxy
    metrics = GatewayMetrics(
        Table([]), MeterWriter(tmp_path / "calls.jsonl", tmp_path / "ledger.db"), state=gw.db
    )
    assert scraped(metrics) == {
        "up": 1.0,
        "read_reasoning": 0.0,
        "write_reasoning": 0.0,
        "history": 0.0,
        "sweep": 0.0,
    }
    pg_proxy.cut()
    await gw.reasoning.task("t")
    await gw.history.changed("t", "agent_turn", as_messages(["s"]))
    found = scraped(metrics)
    assert (found["up"], found["read_reasoning"], found["history"]) == (0.0, 1.0, 1.0)


def scraped(metrics: GatewayMetrics) -> dict[str, float]:
    body, _ = metrics.exposition()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == f"{PREFIX}_state_database_up":
                found["up"] = sample.value
            if sample.name == f"{PREFIX}_state_unavailable_operations_total":
                found[sample.labels["operation"]] = sample.value
    return found


def gateway(state: str, tmp_path: Path, **extra: Any) -> GatewayApp:
    text = yaml.safe_dump(
        {
            "data_dir": str(tmp_path),
            "state": state,
            "metering": False,  # the state is checked on its own, without a ledger
            # nothing listens there: capabilities stay unknown, which start-up allows
            "models": {"m": {"provider": "local", "external_url": "http://127.0.0.1:9"}},
            **extra,
        }
    )
    return GatewayApp(parse_config(text))


async def test_a_state_database_that_cannot_be_reached_stops_the_start(
    pg: PgDatabase, tmp_path: Path
) -> None:
    port = closed_port()
    app = gateway(pg.url_at(port, password="s3cret-pw"), tmp_path)
    try:
        with pytest.raises(RuntimeError) as failed:
            await app.startup()
    finally:
        await app.shutdown()
    message = str(failed.value)
    assert message.startswith(
        f"cannot open the state database postgresql://postgres@127.0.0.1:{port}/"
    )
    assert "ConnectionRefusedError" in message
    assert "s3cret-pw" not in message
    assert failed.value.__cause__ is None and failed.value.__suppress_context__


async def test_the_lifespan_reports_the_failed_start(pg: PgDatabase, tmp_path: Path) -> None:
    app = gateway(pg.url_at(closed_port(), password="s3cret-pw"), tmp_path)
    failed = await startup_report(app)
    assert failed["type"] == "lifespan.startup.failed"
    assert "cannot open the state database postgresql://postgres@127.0.0.1:" in failed["message"]
    assert "s3cret-pw" not in failed["message"]


async def test_a_state_database_that_does_not_exist_stops_the_start(
    pg: PgDatabase, tmp_path: Path
) -> None:
    app = gateway(pg.url + "_absent", tmp_path)
    try:
        with pytest.raises(RuntimeError, match="InvalidCatalogNameError"):
            await app.startup()
    finally:
        await app.shutdown()


async def test_a_state_database_that_cannot_be_migrated_stops_the_start(
    pg: PgDatabase, tmp_path: Path
) -> None:
    pg.execute("CREATE TABLE state_tasks (something_else INTEGER)")
    app = gateway(pg.url, tmp_path)
    try:
        with pytest.raises(RuntimeError, match=r"cannot open the state database .*DuplicateTable"):
            await app.startup()
    finally:
        await app.shutdown()
    # nothing of the failed migration stays: it was one transaction
    assert pg.fetch("SELECT to_regclass('state_migrations') AS t") == [{"t": None}]


async def test_a_reachable_state_database_is_migrated_before_the_gateway_serves(
    pg: PgDatabase, tmp_path: Path
) -> None:
    app = gateway(pg.url, tmp_path, retention={"task_days": 30})
    try:
        await app.startup()
        versions = pg.fetch("SELECT version FROM state_migrations ORDER BY version")
        assert versions == [{"version": m.version} for m in load_state_migrations()]
        assert app.state.database is not None and app.state.database.up
    finally:
        await app.shutdown()
    assert not (tmp_path / "tasks").exists()  # nothing of the state goes to files
