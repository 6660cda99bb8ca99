"""``metering: false``: no call log, no ledger, no writer thread; and batched records stay whole."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import orjson
import pytest

from boundedcode_gateway.config import MeteringSettings, parse_config
from boundedcode_gateway.errors import ConfigError
from boundedcode_gateway.metering.calllog import append_lines, read_calls
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.metering.writer import MeterWriter

_MODELS = "models:\n  m:\n    provider: openai-compatible\n    base_url: http://127.0.0.1:1/v1\n"


def _record(i: int) -> CallRecord:
    return CallRecord(
        call_id=f"call-{i}",
        started_at="2026-01-02T03:04:05.000Z",
        task="t",
        purpose="agent_turn",
        model_profile="m",
        attempt_log=[{"status": 200, "code": None}],
    )


def test_metering_is_on_unless_switched_off() -> None:
    assert parse_config(_MODELS).metering == MeteringSettings(enabled=True, sync=False)
    assert parse_config("metering: false\n" + _MODELS).metering.enabled is False
    assert parse_config("metering: true\n" + _MODELS).metering.enabled is True


def test_metering_takes_a_mapping_with_sync() -> None:
    config = parse_config("metering: {sync: true}\n" + _MODELS)
    assert config.metering == MeteringSettings(enabled=True, sync=True)
    assert parse_config("metering:\n  enabled: false\n" + _MODELS).metering.enabled is False
    with pytest.raises(ConfigError, match=r"metering\.sink: unknown key"):
        parse_config("metering: {sink: x}\n" + _MODELS)
    with pytest.raises(ConfigError, match=r":1: metering"):
        parse_config("metering: yes please\n" + _MODELS)


def test_a_disabled_writer_writes_nothing(tmp_path: Path) -> None:
    writer = MeterWriter(tmp_path / "calls.jsonl", tmp_path / "ledger.db", enabled=False)
    writer.start()
    writer.submit(_record(1))
    assert writer.flush(1.0)
    writer.close()
    assert writer.written == 0
    assert writer.dropped == 0
    assert not (tmp_path / "calls.jsonl").exists()
    assert not (tmp_path / "ledger.db").exists()


def test_a_burst_is_written_whole_and_in_order(tmp_path: Path) -> None:
    writer = MeterWriter(tmp_path / "calls.jsonl", tmp_path / "ledger.db")
    writer.start()
    for i in range(50):
        writer.submit(_record(i))
    assert writer.flush(5.0)
    writer.close()
    rows = read_calls(tmp_path / "calls.jsonl")
    assert [r["call_id"] for r in rows] == [f"call-{i}" for i in range(50)]
    assert writer.written == 50


def test_a_logged_line_reads_like_to_dict(tmp_path: Path) -> None:
    record = _record(7)
    append_lines(tmp_path / "calls.jsonl", [record])
    line = (tmp_path / "calls.jsonl").read_bytes().splitlines()[0]
    assert orjson.loads(line) == asdict(record) == record.to_dict()
