"""The ledger in PostgreSQL: rows read back as written, batches, a row set aside alone, the
migrations (from nothing and from the version before) under their lock, and the readers
(``calls``, ``budgets``, the budgets' start-up read) against it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import sqlite3
import threading
from dataclasses import fields, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from boundedcode_gateway.budgets.spent import HolderSpent, Spent
from boundedcode_gateway.budgets.store import LedgerSpendStore
from boundedcode_gateway.cli.budgets import run_budgets
from boundedcode_gateway.cli.calls import run_calls
from boundedcode_gateway.config import parse_config
from boundedcode_gateway.json_values import MAX_COUNT
from boundedcode_gateway.locations import PostgresLocation
from boundedcode_gateway.metering.calllog import append_lines
from boundedcode_gateway.metering.ledger import Ledger, load_ledger_migrations
from boundedcode_gateway.metering.pg_ledger import (
    MIGRATION_LOCK_KEY,
    PostgresLedger,
    load_pg_migrations,
    migrate,
)
from boundedcode_gateway.metering.records import LEDGER_FIELDS, CallRecord
from boundedcode_gateway.metering.writer import BATCH_MAX, MeterWriter
from tests.postgres_db import PgDatabase
from tests.unit.test_budgets import NOON
from tests.unit.test_budgets import record as spending_record
from tests.unit.test_metering import log_lines, make_record

# the field the newest migration adds a column for
# the fields whose columns the last migration adds (nullable)
NEWEST_FIELDS = ("restored_tokens", "slot_restore_ms", "slot_save_ms")
# the column PostgreSQL adds for insertion order (SQLite's rowid)
SEQ = "seq"
# what each Python type of a ledger field is in PostgreSQL
PG_TYPES = {"str": "text", "int": "bigint", "float": "double precision", "bool": "boolean"}


def every_field_record(i: int) -> CallRecord:
    """A record with every ledger field set, the largest count a BIGINT holds among them."""
    return make_record(
        i,
        error_code="upstream_timeout",
        reasoning_tokens=MAX_COUNT,
        evaluated_tokens=2**63 - 1,
        structured_output="sent",
        schema_valid=True,
        reusable_tokens=4096,
        miss_cause="history_rewrite",
        ttft_derived=True,
        caller="ci-bot",
        cost_usd=0.000123,
        server="qwen[1]",
        restored_tokens=MAX_COUNT,
        slot_restore_ms=4.5,
        slot_save_ms=17.25,
        retried=True,
        stream=False,
        status="error",
        http_status=504,
    )


def ledger_of(pg: PgDatabase) -> PostgresLedger:
    return PostgresLedger(PostgresLocation(pg.url))


def stored_ids(pg: PgDatabase) -> list[str]:
    return [r["call_id"] for r in pg.fetch("SELECT call_id FROM model_calls ORDER BY seq")]


def ledger_values(record: CallRecord) -> dict[str, Any]:
    whole = record.to_dict()
    return {name: whole[name] for name in LEDGER_FIELDS}


def test_records_read_back_with_every_ledger_field_equal(pg: PgDatabase) -> None:
    records = [
        make_record(1, schema_valid=False),  # the optional fields mostly null
        every_field_record(2),
        make_record(3, task="other", changed=None, ttft_ms=None, total_ms=0.0),
    ]
    ledger = ledger_of(pg)
    ledger.open()
    try:
        assert ledger.insert(records) == []
        rows = ledger.recent(None, 10)
    finally:
        ledger.close()
    assert rows == [ledger_values(r) for r in records]
    for row, record in zip(rows, records, strict=True):
        for name in LEDGER_FIELDS:  # a bool stays a bool, an int an int
            assert type(row[name]) is type(ledger_values(record)[name]), name
    # the table itself: the same values, column by column, in LEDGER_FIELDS' order
    raw = pg.fetch("SELECT * FROM model_calls ORDER BY seq")
    assert [[k for k in row if k != SEQ] for row in raw] == [list(LEDGER_FIELDS)] * 3
    assert [{k: v for k, v in row.items() if k != SEQ} for row in raw] == rows


def test_batches_are_written_whole_and_in_order(pg: PgDatabase, tmp_path: Path) -> None:
    count = 2 * BATCH_MAX + 88
    writer = MeterWriter(tmp_path / "calls.jsonl", PostgresLocation(pg.url))
    for i in range(count):
        writer.submit(make_record(i))  # all queued before the thread starts: full batches
    writer.start()
    assert writer.flush(30.0)
    writer.close()
    assert stored_ids(pg) == [f"call-{i:05d}" for i in range(count)]
    assert (writer.written, writer.errors, writer.set_aside) == (count, 0, 0)
    assert (writer.ledger_buffered, writer.ledger_dropped) == (0, 0)


def test_a_row_the_database_cannot_hold_is_set_aside_without_its_batch(
    pg: PgDatabase, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls_path = tmp_path / "calls.jsonl"
    writer = MeterWriter(calls_path, PostgresLocation(pg.url))
    writer.start()
    writer.submit(make_record(0))
    assert writer.flush(10.0)
    poisoned = [
        make_record(1),
        make_record(2, prompt_tokens=2**63),  # past BIGINT (the call log holds it)
        make_record(3, model_profile="nul\x00in a name"),  # PostgreSQL text holds no NUL
        make_record(0, task="another"),  # a call id already there, other values
        make_record(4),
    ]
    with caplog.at_level(logging.ERROR, logger="boundedcode_gateway.metering.writer"):
        for record in poisoned:
            writer.submit(record)
        assert writer.flush(10.0)
        writer.close()
    assert stored_ids(pg) == ["call-00000", "call-00001", "call-00004"]
    assert len(log_lines(calls_path)) == 6  # the call log holds every one
    assert (writer.set_aside, writer.errors, writer.written) == (3, 0, 6)
    messages = [r.getMessage() for r in caplog.records]
    for call_id in ("call-00002", "call-00003", "call-00000"):
        assert any(f"ledger cannot hold call {call_id}" in m for m in messages), call_id
    assert any("UniqueViolationError" in m or "duplicate key" in m for m in messages)


def test_a_record_already_written_by_an_attempt_whose_answer_was_lost_is_not_a_duplicate(
    pg: PgDatabase,
) -> None:
    ledger = ledger_of(pg)
    ledger.open()
    try:
        assert ledger.insert([make_record(1), make_record(2)]) == []
        # the same batch again, as after a connection lost before the commit's answer
        again = ledger.insert([make_record(1), make_record(2), make_record(3)])
        changed = ledger.insert([replace(make_record(2), messages=99)])
    finally:
        ledger.close()
    assert again == []
    assert [(r.call_id, type(e).__name__) for r, e in changed] == [
        ("call-00002", "UniqueViolationError")
    ]
    assert stored_ids(pg) == ["call-00001", "call-00002", "call-00003"]


def pg_columns(pg: PgDatabase) -> list[tuple[str, str]]:
    rows = pg.fetch(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = 'model_calls' ORDER BY ordinal_position"
    )
    return [(r["column_name"], r["data_type"]) for r in rows]


def pg_indexes(pg: PgDatabase) -> dict[str, str]:
    rows = pg.fetch("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'model_calls'")
    return {r["indexname"]: r["indexdef"] for r in rows}


def test_migrations_from_an_empty_database(pg: PgDatabase, tmp_path: Path) -> None:
    for _ in range(2):  # opening again applies nothing twice
        ledger = ledger_of(pg)
        ledger.open()
        ledger.close()
    versions = pg.fetch("SELECT version, name FROM schema_migrations ORDER BY version")
    assert [(v["version"], v["name"]) for v in versions] == [
        (m.version, m.name) for m in load_ledger_migrations()
    ]
    # the columns are the record's ledger fields, each of the type its Python type says
    kinds = {f.name: str(f.type).removesuffix(" | None") for f in fields(CallRecord)}
    columns = pg_columns(pg)
    assert [name for name, _ in columns if name != SEQ] == list(LEDGER_FIELDS)
    for name, data_type in columns:
        if name != SEQ:
            assert data_type == PG_TYPES[kinds[name]], name
    # the same indexes as the SQLite ledger, on the same columns
    sqlite_ledger = Ledger(tmp_path / "ledger.db")
    sqlite_ledger.open()
    sqlite_ledger.close()
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        sqlite_indexes = {
            name: [c[2] for c in db.execute(f"PRAGMA index_info({name})")]
            for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
            )
        }
    indexes = pg_indexes(pg)
    assert set(indexes) == {"model_calls_pkey", *sqlite_indexes}
    for name, columns_of_index in sqlite_indexes.items():
        assert f"({', '.join(columns_of_index)})" in indexes[name]


async def test_migrations_from_the_version_before(pg: PgDatabase) -> None:
    previous = load_pg_migrations()[:-1]
    assert previous[-1].version == 8
    # the columns of the previous version: all but the record's newest fields, whose
    # columns the last migration adds, empty for the rows before it
    columns = [f for f in LEDGER_FIELDS if f not in NEWEST_FIELDS]
    row = dataclasses.replace(
        every_field_record(7), restored_tokens=None, slot_restore_ms=None, slot_save_ms=None
    )
    conn = await asyncpg.connect(pg.url)
    try:
        await migrate(conn, previous)
        before = dict(await asyncio.to_thread(pg_columns, pg))
        assert not set(NEWEST_FIELDS) & set(before)
        values = [tuple(getattr(row, f) for f in columns)]
        await conn.copy_records_to_table("model_calls", records=values, columns=columns)
    finally:
        await conn.close()

    def reopen() -> list[dict[str, Any]]:
        ledger = ledger_of(pg)
        ledger.open()
        try:
            return ledger.recent(None, 5)
        finally:
            ledger.close()

    assert await asyncio.to_thread(reopen) == [ledger_values(row)]
    versions = await asyncio.to_thread(
        pg.fetch, "SELECT version FROM schema_migrations ORDER BY version"
    )
    assert [v["version"] for v in versions] == [m.version for m in load_pg_migrations()]
    assert set(NEWEST_FIELDS) <= set(dict(await asyncio.to_thread(pg_columns, pg)))


def test_migrations_wait_for_the_lock_another_gateway_holds(pg: PgDatabase) -> None:
    held = threading.Event()
    release = threading.Event()

    async def hold_lock() -> None:
        conn = await asyncpg.connect(pg.url)
        try:
            await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
            held.set()
            await asyncio.to_thread(release.wait, 30)
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
        finally:
            await conn.close()

    holder = threading.Thread(target=lambda: asyncio.run(hold_lock()))
    holder.start()
    try:
        assert held.wait(10)
        opened = threading.Event()
        ledger = ledger_of(pg)

        def open_ledger() -> None:
            ledger.open()
            opened.set()

        opener = threading.Thread(target=open_ledger)
        opener.start()
        assert not opened.wait(0.5)  # waiting for the lock: nothing migrated yet
        assert pg.fetch("SELECT to_regclass('model_calls') AS t") == [{"t": None}]
        release.set()
        opener.join(10)
        assert opened.is_set()
        ledger.close()
    finally:
        release.set()
        holder.join(10)


def test_gateways_starting_at_once_apply_each_migration_once(pg: PgDatabase) -> None:
    failures: list[BaseException] = []
    start = threading.Barrier(4)

    def open_one() -> None:
        ledger = ledger_of(pg)
        start.wait(10)
        try:
            ledger.open()
        except BaseException as exc:
            failures.append(exc)
        finally:
            ledger.close()

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert failures == []
    versions = pg.fetch("SELECT version FROM schema_migrations ORDER BY version")
    assert [v["version"] for v in versions] == [m.version for m in load_ledger_migrations()]


def parity_records() -> list[CallRecord]:
    yesterday = NOON - timedelta(days=1)
    return [
        spending_record(0, "ci", "t1", yesterday, cost_usd=1.0),
        spending_record(1, "ci", "t1", NOON.replace(hour=0), cost_usd=0.25),
        spending_record(2, "ci", "t2", NOON, cost_usd=None, completion_tokens=None),
        spending_record(3, "ops", "t2", NOON + timedelta(days=1)),
        spending_record(4, None, "t1", NOON, prompt_tokens=7, cost_usd=0.0),
        spending_record(5, None, "t1", NOON),  # the same millisecond as the one before
    ]


def test_the_readers_see_what_the_sqlite_ledger_would_show(pg: PgDatabase, tmp_path: Path) -> None:
    records = parity_records()
    answers = []
    for ledger in (Ledger(tmp_path / "ledger.db"), ledger_of(pg)):
        ledger.open()
        try:
            ledger.insert(records)
            answers.append(
                (
                    ledger.recent(None, 4),
                    ledger.recent("t1", 2),
                    ledger.recent("absent", 2),
                    sorted(ledger.spending("2026-03-01", "2026-03-02")),
                )
            )
        finally:
            ledger.close()
    sqlite_answer, pg_answer = answers
    assert pg_answer == sqlite_answer
    assert [r["call_id"] for r in pg_answer[1]] == ["call-00004", "call-00005"]


def test_the_budgets_spending_is_read_from_postgresql(pg: PgDatabase) -> None:
    ledger = ledger_of(pg)
    ledger.open()
    ledger.insert(parity_records())
    ledger.close()
    spent = LedgerSpendStore(PostgresLocation(pg.url), read_only=True).spent("2026-03-01")
    assert spent[("caller", "ci")] == HolderSpent(
        "2026-03-01", Spent(0.25, 220, 200), Spent(1.25, 340, 300)
    )
    assert spent[("task", "t1")].lifetime == Spent(1.75, 387, 400)


def test_a_read_only_reader_writes_nothing(pg: PgDatabase) -> None:
    reader = ledger_of(pg)
    reader.open(read_only=True)
    try:
        with pytest.raises(asyncpg.UndefinedTableError):
            reader.recent(None, 1)  # not migrated: a reader creates nothing
    finally:
        reader.close()
    assert pg.fetch("SELECT to_regclass('schema_migrations') AS t") == [{"t": None}]
    writer = ledger_of(pg)
    writer.open()
    writer.close()
    reader.open(read_only=True)
    try:
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            reader.insert([make_record(1)])
    finally:
        reader.close()


def config_text(ledger: str, tmp_path: Path, **extra: Any) -> str:
    return yaml.safe_dump(
        {
            "data_dir": str(tmp_path),
            "ledger": ledger,
            "models": {"m": {"provider": "local", "external_url": "http://127.0.0.1:9"}},
            **extra,
        }
    )


def test_the_calls_command_reads_postgresql(
    pg: PgDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = ledger_of(pg)
    ledger.open()
    ledger.insert([make_record(i, task="alpha" if i % 2 else "beta") for i in range(5)])
    ledger.close()
    config = parse_config(config_text(pg.url, tmp_path))
    assert run_calls(config.ledger_location, config.calls_path, "alpha", 10) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[1:]] == ["alpha", "alpha"]
    assert [line.split()[0] for line in lines[1:]] == [
        "2026-01-02T03:04:05.001Z",
        "2026-01-02T03:04:05.003Z",
    ]


def closed_port() -> int:
    """A port nothing listens on (taken from the system, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_calls_command_falls_back_to_the_call_log_without_the_database(
    pg: PgDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = pg.url_at(closed_port(), password="hunter2-secret")
    config = parse_config(config_text(url, tmp_path))
    append_lines(config.calls_path, [make_record(1), make_record(2)])
    assert run_calls(config.ledger_location, config.calls_path, None, 10) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 3
    assert "cannot read the ledger postgresql://postgres@127.0.0.1:" in captured.err
    assert "hunter2-secret" not in captured.err


def test_the_budgets_command_reads_postgresql(
    pg: PgDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = ledger_of(pg)
    ledger.open()
    ledger.insert([replace(make_record(1), started_at="2026-01-02T00:00:00.000Z")])
    ledger.close()
    budget = {"task": {"max_tokens": 10_000, "per": "lifetime"}}
    config = parse_config(config_text(pg.url, tmp_path, budgets=budget))
    assert run_budgets(config) == 0
    assert "task    task-a  lifetime  max_tokens  1,051  0     10,000" in capsys.readouterr().out
    # without the database: an error naming it, no password
    down = parse_config(config_text(pg.url_at(closed_port(), "pw-42"), tmp_path, budgets=budget))
    assert run_budgets(down) == 1
    err = capsys.readouterr().err
    assert "cannot read the ledger postgresql://postgres@127.0.0.1:" in err
    assert "pw-42" not in err
