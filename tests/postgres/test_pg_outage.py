"""A PostgreSQL ledger that goes away: at start the gateway refuses to serve; while serving,
the writer keeps what it could not write (bounded), never holds a call up, and writes it
all, in order and once, when the database is back. The database is cut off by a TCP proxy
of the test's own (tests/fakes/tcp_proxy.py): the real server is never stopped."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from boundedcode_gateway.app import GatewayApp
from boundedcode_gateway.config import parse_config
from boundedcode_gateway.locations import PostgresLocation
from boundedcode_gateway.metering.pg_ledger import load_pg_migrations
from boundedcode_gateway.metering.writer import MeterWriter
from boundedcode_gateway.operations.metrics import PREFIX, GatewayMetrics
from tests.fakes.tcp_proxy import TcpProxy
from tests.lifespan import startup_report
from tests.postgres.test_pg_ledger import closed_port, stored_ids
from tests.postgres_db import PgDatabase
from tests.unit.test_metering import log_lines, make_record
from tests.unit.test_metrics import Table

# the writer's backoff tops out at 30 s; a cut of a second or two is tried again sooner
BACK_WITHIN_S = 40.0


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def submit_all(writer: MeterWriter, numbers: range) -> None:
    """Submit one record at a time, each its own batch, waiting on its future (sync)."""
    for i in numbers:
        future = writer.submit(make_record(i))
        assert isinstance(future, Future)
        future.result(timeout=15)  # never held up by the database


def test_records_wait_while_the_database_is_away_and_are_written_once_back(
    pg: PgDatabase, pg_proxy: TcpProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls_path = tmp_path / "calls.jsonl"
    location = PostgresLocation(pg.url_at(pg_proxy.port))
    writer = MeterWriter(calls_path, location, sync=True)
    writer.start()
    try:
        submit_all(writer, range(3))
        assert stored_ids(pg) == [f"call-{i:05d}" for i in range(3)]

        pg_proxy.cut()
        with caplog.at_level(logging.ERROR, logger="boundedcode_gateway.metering.writer"):
            started = time.monotonic()
            submit_all(writer, range(3, 10))
            assert time.monotonic() - started < 10.0
        assert writer.ledger_buffered == 7
        assert writer.errors >= 1
        assert len(stored_ids(pg)) == 3
        # the call log is written throughout
        assert [line["call_id"] for line in log_lines(calls_path)] == [
            f"call-{i:05d}" for i in range(10)
        ]

        pg_proxy.restore()
        wait_for(lambda: writer.ledger_buffered == 0, BACK_WITHIN_S, "the buffer to drain")
        submit_all(writer, range(10, 12))
    finally:
        writer.close()
    assert stored_ids(pg) == [f"call-{i:05d}" for i in range(12)]  # in order, each once
    assert (writer.ledger_dropped, writer.set_aside, writer.written) == (0, 0, 12)
    assert any("ledger failed" in r.getMessage() for r in caplog.records)


def test_a_full_buffer_drops_the_oldest_and_counts_them(
    pg: PgDatabase, pg_proxy: TcpProxy, tmp_path: Path
) -> None:
    location = PostgresLocation(pg.url_at(pg_proxy.port))
    writer = MeterWriter(tmp_path / "calls.jsonl", location, sync=True, ledger_buffer_records=3)
    metrics = GatewayMetrics(Table([]), writer)
    writer.start()
    try:
        submit_all(writer, range(2))
        pg_proxy.cut()
        submit_all(writer, range(2, 8))
        assert (writer.ledger_buffered, writer.ledger_dropped) == (3, 3)
        assert scraped(metrics) == {"buffered": 3.0, "dropped": 3.0}
        pg_proxy.restore()
        wait_for(lambda: writer.ledger_buffered == 0, BACK_WITHIN_S, "the buffer to drain")
        assert scraped(metrics) == {"buffered": 0.0, "dropped": 3.0}
    finally:
        writer.close()
    # the two written before the cut, then the newest three: 2, 3 and 4 were dropped
    assert stored_ids(pg) == ["call-00000", "call-00001", "call-00005", "call-00006", "call-00007"]
    assert len(log_lines(tmp_path / "calls.jsonl")) == 8
    assert writer.ledger_dropped == 3


def scraped(metrics: GatewayMetrics) -> dict[str, float]:
    body, _ = metrics.exposition()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == f"{PREFIX}_metering_ledger_buffered_records":
                found["buffered"] = sample.value
            if sample.name == f"{PREFIX}_metering_ledger_dropped_records_total":
                found["dropped"] = sample.value
    return found


def test_a_kept_record_the_database_cannot_hold_is_set_aside_when_it_is_back(
    pg: PgDatabase, pg_proxy: TcpProxy, tmp_path: Path
) -> None:
    location = PostgresLocation(pg.url_at(pg_proxy.port))
    writer = MeterWriter(tmp_path / "calls.jsonl", location, sync=True)
    writer.start()
    try:
        pg_proxy.cut()
        for record in (make_record(0), make_record(1, prompt_tokens=2**63), make_record(2)):
            future = writer.submit(record)
            assert future is not None
            future.result(timeout=15)
        pg_proxy.restore()
        wait_for(lambda: writer.ledger_buffered == 0, BACK_WITHIN_S, "the buffer to drain")
    finally:
        writer.close()
    assert stored_ids(pg) == ["call-00000", "call-00002"]
    assert (writer.set_aside, writer.ledger_dropped, writer.written) == (1, 0, 3)


def test_a_writer_started_while_the_database_is_away_writes_once_it_is_back(
    pg: PgDatabase, pg_proxy: TcpProxy, tmp_path: Path
) -> None:
    pg_proxy.cut()
    writer = MeterWriter(tmp_path / "calls.jsonl", PostgresLocation(pg.url_at(pg_proxy.port)))
    writer.start()
    try:
        for i in range(4):
            writer.submit(make_record(i))
        assert writer.flush(10.0)  # kept, not waited for
        assert writer.ledger_buffered == 4
        pg_proxy.restore()
        wait_for(lambda: writer.ledger_buffered == 0, BACK_WITHIN_S, "the buffer to drain")
    finally:
        writer.close()
    assert stored_ids(pg) == [f"call-{i:05d}" for i in range(4)]
    assert writer.written == 4


def test_records_still_kept_when_the_writer_stops_are_counted_lost(
    pg: PgDatabase, pg_proxy: TcpProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = MeterWriter(tmp_path / "calls.jsonl", PostgresLocation(pg.url_at(pg_proxy.port)))
    writer.start()
    writer.submit(make_record(0))
    assert writer.flush(10.0)
    pg_proxy.cut()
    writer.submit(make_record(1))
    writer.submit(make_record(2))
    with caplog.at_level(logging.ERROR, logger="boundedcode_gateway.metering.writer"):
        writer.close()
    assert (writer.ledger_buffered, writer.ledger_dropped) == (0, 2)
    assert stored_ids(pg) == ["call-00000"]
    assert len(log_lines(tmp_path / "calls.jsonl")) == 3
    assert any("2 records never reached the ledger" in r.getMessage() for r in caplog.records)


def test_a_writer_stopping_once_the_database_is_back_writes_what_it_kept_first(
    pg: PgDatabase, pg_proxy: TcpProxy, tmp_path: Path
) -> None:
    writer = MeterWriter(tmp_path / "calls.jsonl", PostgresLocation(pg.url_at(pg_proxy.port)))
    writer.start()
    pg_proxy.cut()
    writer.submit(make_record(0))
    writer.submit(make_record(1))
    # a try after 0.5 s fails too: the next is a second later, after the writer is stopped
    wait_for(lambda: writer.errors >= 2, 10.0, "a second failed try")
    pg_proxy.restore()
    writer.close()
    assert stored_ids(pg) == ["call-00000", "call-00001"]
    assert (writer.ledger_buffered, writer.ledger_dropped) == (0, 0)


def gateway(ledger: str, tmp_path: Path, **extra: Any) -> GatewayApp:
    text = yaml.safe_dump(
        {
            "data_dir": str(tmp_path),
            "ledger": ledger,
            # nothing listens there: capabilities stay unknown, which start-up allows
            "models": {"m": {"provider": "local", "external_url": "http://127.0.0.1:9"}},
            **extra,
        }
    )
    return GatewayApp(parse_config(text))


async def test_a_database_that_cannot_be_reached_stops_the_start(
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
    assert message.startswith(f"cannot open the ledger postgresql://postgres@127.0.0.1:{port}/")
    assert "ConnectionRefusedError" in message
    assert "s3cret-pw" not in message
    assert failed.value.__cause__ is None and failed.value.__suppress_context__
    assert app.writer.written == 0 and not app.writer.queued


async def test_the_lifespan_reports_the_failed_start(pg: PgDatabase, tmp_path: Path) -> None:
    app = gateway(pg.url_at(closed_port(), password="s3cret-pw"), tmp_path)
    failed = await startup_report(app)
    assert failed["type"] == "lifespan.startup.failed"
    assert "cannot open the ledger postgresql://postgres@127.0.0.1:" in failed["message"]
    assert "s3cret-pw" not in failed["message"]


async def test_a_database_that_does_not_exist_stops_the_start(
    pg: PgDatabase, tmp_path: Path
) -> None:
    app = gateway(pg.url + "_absent", tmp_path)
    try:
        with pytest.raises(RuntimeError, match="InvalidCatalogNameError"):
            await app.startup()
    finally:
        await app.shutdown()


async def test_a_database_that_cannot_be_migrated_stops_the_start(
    pg: PgDatabase, tmp_path: Path
) -> None:
    pg.execute("CREATE TABLE model_calls (something_else INTEGER)")
    app = gateway(pg.url, tmp_path)
    try:
        with pytest.raises(RuntimeError, match=r"cannot open the ledger .*DuplicateTableError"):
            await app.startup()
    finally:
        await app.shutdown()
    # nothing of the failed migration stays: it was one transaction
    assert pg.fetch("SELECT to_regclass('schema_migrations') AS t") == [{"t": None}]


async def test_a_reachable_database_is_migrated_before_the_gateway_serves(
    pg: PgDatabase, tmp_path: Path
) -> None:
    app = gateway(pg.url, tmp_path)
    try:
        await app.startup()
        versions = pg.fetch("SELECT version FROM schema_migrations ORDER BY version")
        assert [v["version"] for v in versions] == [m.version for m in load_pg_migrations()]
    finally:
        await app.shutdown()


async def test_without_metering_the_database_is_not_asked(tmp_path: Path) -> None:
    app = gateway(f"postgresql://postgres@127.0.0.1:{closed_port()}/x", tmp_path, metering=False)
    try:
        await app.startup()
    finally:
        await app.shutdown()


def test_the_proxy_cuts_every_connection_and_refuses_new_ones_until_restored(
    pg_proxy: TcpProxy,
) -> None:
    with socket.create_connection(("127.0.0.1", pg_proxy.port), timeout=5) as through:
        # PostgreSQL answers an SSL request with one byte: the server is behind the proxy
        through.sendall(b"\x00\x00\x00\x08\x04\xd2\x16\x2f")
        assert through.recv(1) in (b"S", b"N")
        pg_proxy.cut()
        try:
            through.sendall(b"x" * 8)
            ended = through.recv(1) == b""
        except OSError:  # reset
            ended = True
        assert ended
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", pg_proxy.port), timeout=5).close()
    pg_proxy.restore()
    with socket.create_connection(("127.0.0.1", pg_proxy.port), timeout=5) as again:
        again.sendall(b"\x00\x00\x00\x08\x04\xd2\x16\x2f")
        assert again.recv(1) in (b"S", b"N")
    assert pg_proxy.accepted == 2
