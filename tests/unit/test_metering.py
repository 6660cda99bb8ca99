"""Metering: the call log, the ledger, the background writer and the ``calls`` table."""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from pathlib import Path
from typing import Any

import orjson
import pytest

from boundedcode_gateway.cli.calls import format_calls_table, run_calls
from boundedcode_gateway.metering.calllog import append_lines, read_calls
from boundedcode_gateway.metering.ledger import Ledger, load_ledger_migrations
from boundedcode_gateway.metering.records import LEDGER_FIELDS, RECORD_FIELDS, CallRecord
from boundedcode_gateway.metering.writer import MeterWriter

_T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def make_record(i: int = 0, task: str = "task-a", **overrides: Any) -> CallRecord:
    started = _T0 + timedelta(milliseconds=i)
    record = CallRecord(
        call_id=f"call-{i:05d}",
        started_at=started.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        task=task,
        purpose="edit",
        model_profile="local-small",
        provider="local",
        upstream_model="qwen-small",
        stream=True,
        status="ok",
        http_status=200,
        finish_reason="stop",
        prompt_tokens=1000 + i,
        cached_tokens=800,
        completion_tokens=50,
        reasoning_tokens=None,
        evaluated_tokens=200 + i,
        ttft_ms=123.456,
        prefill_ms=100.25,
        decode_ms=400.5,
        total_ms=524.75,
        messages=7,
        changed=2,
        retried=False,
        attempts=1,
    )
    return replace(record, **overrides)


def ledger_rows(path: Path) -> list[dict[str, Any]]:
    with closing(sqlite3.connect(path)) as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute("SELECT * FROM model_calls ORDER BY rowid").fetchall()
    return [dict(row) for row in rows]


def log_lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


@pytest.fixture
def paths(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "data" / "calls.jsonl", tmp_path / "data" / "ledger.db"


def test_record_reaches_both_sinks_field_by_field(paths: tuple[Path, Path]) -> None:
    calls_path, ledger_path = paths
    record = make_record(3, error_code=None, retried=True, changed=None)
    writer = MeterWriter(calls_path, ledger_path)
    writer.start()
    writer.submit(record)
    assert writer.flush(timeout=5.0)
    writer.close()

    expected = record.to_dict()
    [line] = log_lines(calls_path)
    assert line == expected
    assert list(line) == list(RECORD_FIELDS)

    [row] = ledger_rows(ledger_path)
    assert list(row) == list(LEDGER_FIELDS)
    for name in LEDGER_FIELDS:
        # SQLite stores BOOLEAN as 0/1, which compares equal to False/True.
        assert row[name] == expected[name], name
    assert writer.written == 1
    assert writer.errors == 0
    assert writer.dropped == 0


def test_close_writes_every_submitted_record_once(paths: tuple[Path, Path]) -> None:
    calls_path, ledger_path = paths
    writer = MeterWriter(calls_path, ledger_path)
    writer.start()
    for i in range(500):
        writer.submit(make_record(i))
    writer.close()

    lines = log_lines(calls_path)
    assert len(lines) == 500
    assert len({line["call_id"] for line in lines}) == 500
    rows = ledger_rows(ledger_path)
    assert len(rows) == 500
    assert {row["call_id"] for row in rows} == {f"call-{i:05d}" for i in range(500)}
    assert writer.written == 500
    assert writer.errors == 0


def test_close_without_start_still_writes_queued_records(paths: tuple[Path, Path]) -> None:
    calls_path, ledger_path = paths
    writer = MeterWriter(calls_path, ledger_path)
    writer.submit(make_record(1))
    writer.close()
    assert [line["call_id"] for line in log_lines(calls_path)] == ["call-00001"]
    assert [row["call_id"] for row in ledger_rows(ledger_path)] == ["call-00001"]


def test_submit_after_close_is_dropped(paths: tuple[Path, Path]) -> None:
    calls_path, ledger_path = paths
    writer = MeterWriter(calls_path, ledger_path)
    writer.start()
    writer.close()
    writer.submit(make_record(1))
    assert writer.dropped == 1


def test_migrations_applied_twice_are_recorded_once(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "ledger.db"
    for _ in range(2):
        ledger = Ledger(path)
        ledger.open()
        ledger.insert([make_record(len(ledger.recent(None, 10)))])
        ledger.close()

    sql_files = sorted(
        entry.name
        for entry in files("boundedcode_gateway.metering").joinpath("migrations").iterdir()
        if entry.name.endswith(".sql")
    )
    assert sql_files
    assert [m.version for m in load_ledger_migrations()] == [int(n[:4]) for n in sql_files]
    with closing(sqlite3.connect(path)) as conn:
        versions = conn.execute(
            "SELECT version, name FROM schema_migrations ORDER BY version"
        ).fetchall()
        count = conn.execute("SELECT COUNT(*) FROM model_calls").fetchone()[0]
        columns = [row[1] for row in conn.execute("PRAGMA table_info(model_calls)")]
    assert [v for v, _ in versions] == [int(n[:4]) for n in sql_files]
    assert versions[0] == (1, "model_calls")
    assert count == 2
    assert columns == list(LEDGER_FIELDS)


def test_ledger_recent_is_newest_last_and_filters_task(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.open()
    try:
        ledger.insert([make_record(i, task="a" if i % 2 else "b") for i in range(10)])
        recent = ledger.recent("a", 3)
        everything = ledger.recent(None, 100)
    finally:
        ledger.close()
    assert [r["call_id"] for r in recent] == ["call-00005", "call-00007", "call-00009"]
    assert len(everything) == 10
    assert everything[-1]["call_id"] == "call-00009"
    assert everything[0]["stream"] is True
    assert everything[0]["retried"] is False


def test_read_calls_skips_partial_last_line_and_filters(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    append_lines(path, [make_record(i, task="a" if i % 2 else "b") for i in range(6)])
    with path.open("ab") as f:
        f.write(b'{"call_id": "call-99999", "task": "a", "sta')  # crash mid-write

    assert [r["call_id"] for r in read_calls(path)] == [f"call-{i:05d}" for i in range(6)]
    assert [r["call_id"] for r in read_calls(path, task="a")] == [
        "call-00001",
        "call-00003",
        "call-00005",
    ]
    assert [r["call_id"] for r in read_calls(path, task="b", last=2)] == [
        "call-00002",
        "call-00004",
    ]
    assert [r["call_id"] for r in read_calls(path, last=1)] == ["call-00005"]

    # The next append starts on a fresh line, so the record after a crash survives.
    append_lines(path, [make_record(6)])
    assert read_calls(path, last=1)[0]["call_id"] == "call-00006"


def test_read_calls_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_calls(tmp_path / "absent.jsonl") == []


def test_unwritable_ledger_keeps_call_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls_path = tmp_path / "calls.jsonl"
    ledger_path = tmp_path / "ledger-is-a-dir"
    ledger_path.mkdir()
    writer = MeterWriter(calls_path, ledger_path)
    with caplog.at_level(logging.ERROR, logger="boundedcode_gateway.metering.writer"):
        writer.start()
        for i in range(3):
            writer.submit(make_record(i))
        assert writer.flush(timeout=5.0)
        writer.close()

    assert [line["call_id"] for line in log_lines(calls_path)] == [
        "call-00000",
        "call-00001",
        "call-00002",
    ]
    assert writer.errors > 0
    assert writer.written == 3
    assert any("ledger" in r.getMessage() for r in caplog.records)


def test_unwritable_call_log_keeps_ledger(tmp_path: Path) -> None:
    calls_path = tmp_path / "calls-is-a-dir"
    calls_path.mkdir()
    ledger_path = tmp_path / "ledger.db"
    writer = MeterWriter(calls_path, ledger_path)
    writer.start()
    writer.submit(make_record(1))
    writer.submit(make_record(2))
    writer.close()
    assert [row["call_id"] for row in ledger_rows(ledger_path)] == ["call-00001", "call-00002"]
    assert writer.errors >= 1
    assert writer.written == 2


def test_ledger_error_does_not_stop_the_writer(paths: tuple[Path, Path]) -> None:
    calls_path, ledger_path = paths
    writer = MeterWriter(calls_path, ledger_path)
    writer.start()
    writer.submit(make_record(1))
    assert writer.flush()
    writer.submit(make_record(1))  # same call_id: the ledger refuses the row
    assert writer.flush()
    writer.submit(make_record(2))
    writer.close()
    assert (writer.errors, writer.set_aside) == (0, 1)
    assert [row["call_id"] for row in ledger_rows(ledger_path)] == ["call-00001", "call-00002"]
    assert len(log_lines(calls_path)) == 3


def test_submit_drops_when_queue_full(
    paths: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    calls_path, ledger_path = paths
    writer = MeterWriter(calls_path, ledger_path, max_queue=2)
    with caplog.at_level(logging.WARNING, logger="boundedcode_gateway.metering.writer"):
        for i in range(5):
            writer.submit(make_record(i))  # not started: nothing drains the queue
    assert writer.dropped == 3
    assert writer.written == 0
    assert any("dropped" in r.getMessage() for r in caplog.records)
    assert not writer.flush(timeout=0.01)


def test_format_calls_table() -> None:
    rows = [
        make_record(1, cached_tokens=None, ttft_ms=12.34).to_dict(),
        make_record(
            2,
            task="task-b",
            status="error",
            http_status=502,
            error_code="upstream_stream_broken",
            front="messages",
            total_ms=None,
        ).to_dict(),
    ]
    text = format_calls_table(rows)
    lines = text.splitlines()
    assert len(lines) == 3
    header = lines[0].split()
    assert header == [
        "started",
        "task",
        "purpose",
        "front",
        "model",
        "status",
        "http",
        "error",
        "prompt",
        "cached",
        "evaluated",
        "completion",
        "ttft_ms",
        "total_ms",
        "msgs",
        "changed",
        "retried",
        "attempts",
    ]
    first = lines[1].split()
    assert first[0] == "2026-01-02T03:04:05.001Z"
    assert first[3] == "chat"
    assert first[7] == "-"  # no error
    assert first[9] == "-"  # cached_tokens None
    assert first[12] == "12.3"  # ttft_ms, one decimal
    second = lines[2].split()
    assert second[1] == "task-b"
    assert second[3] == "messages"
    assert second[6:8] == ["502", "upstream_stream_broken"]
    assert second[13] == "-"  # total_ms None
    # Columns line up: every row is as wide as the header or narrower after rstrip.
    assert len({line.index("task-") for line in lines[1:]}) == 1


def test_format_calls_table_empty() -> None:
    lines = format_calls_table([]).splitlines()
    assert len(lines) == 2
    assert lines[0].split()[0] == "started"
    assert lines[1] == "(no calls)"


def _write_mixed_tasks(calls_path: Path, ledger_path: Path) -> None:
    writer = MeterWriter(calls_path, ledger_path)
    writer.start()
    for i in range(6):
        writer.submit(make_record(i, task="alpha" if i % 3 == 0 else "beta"))
    writer.close()


def test_run_calls_reads_ledger_for_one_task(
    paths: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    calls_path, ledger_path = paths
    _write_mixed_tasks(calls_path, ledger_path)
    calls_path.unlink()  # proves the rows come from the ledger

    assert run_calls(ledger_path, calls_path, task="alpha", last=10) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert [line.split()[1] for line in lines[1:]] == ["alpha", "alpha"]
    assert [line.split()[0] for line in lines[1:]] == [
        "2026-01-02T03:04:05.000Z",
        "2026-01-02T03:04:05.003Z",
    ]


def test_run_calls_falls_back_to_call_log(
    paths: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    calls_path, ledger_path = paths
    _write_mixed_tasks(calls_path, ledger_path)
    ledger_path.unlink()

    assert run_calls(ledger_path, calls_path, task="beta", last=2) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert [line.split()[1] for line in lines[1:]] == ["beta", "beta"]
    assert [line.split()[0] for line in lines[1:]] == [
        "2026-01-02T03:04:05.004Z",
        "2026-01-02T03:04:05.005Z",
    ]
    assert not ledger_path.exists()  # reading never creates the ledger
