"""One poisoned record costs only itself: an upstream's count too large for a sink is clamped
where it is read, and a record a sink still cannot hold is set aside without its batch."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from boundedcode_gateway.json_values import MAX_COUNT, count_or_none
from boundedcode_gateway.metering.ledger import Ledger
from boundedcode_gateway.metering.writer import MeterWriter
from boundedcode_gateway.providers.anthropic.response import read_usage as anthropic_usage
from boundedcode_gateway.providers.gemini.response import read_usage as gemini_usage
from boundedcode_gateway.providers.openai_compat.mapping import (
    read_progress,
    read_timings,
)
from boundedcode_gateway.providers.openai_compat.mapping import read_usage as openai_usage
from boundedcode_gateway.upstream.metrics import CallMetrics
from tests.unit.test_metering import ledger_rows, log_lines, make_record

U64_MAX = 2**64 - 1  # the largest integer orjson reads; SQLite stores up to 2**63 - 1


@pytest.mark.parametrize(
    ("value", "count"),
    [
        (12, 12),
        (0, 0),
        (MAX_COUNT, MAX_COUNT),
        (2**63, MAX_COUNT),
        (U64_MAX, MAX_COUNT),
        (-1, None),
        (1e30, None),  # how orjson reads 10**30
        (True, None),
        ("12", None),
        (None, None),
    ],
)
def test_count_or_none(value: Any, count: int | None) -> None:
    assert count_or_none(value) == count


def test_every_provider_clamps_its_counts_on_read() -> None:
    openai = CallMetrics()
    openai_usage(
        {
            "prompt_tokens": U64_MAX,
            "completion_tokens": U64_MAX,
            "prompt_tokens_details": {"cached_tokens": U64_MAX},
            "completion_tokens_details": {"reasoning_tokens": -5},
        },
        openai,
    )
    assert (openai.prompt_tokens, openai.completion_tokens, openai.cached_tokens) == (
        MAX_COUNT,
        MAX_COUNT,
        MAX_COUNT,
    )
    assert openai.reasoning_tokens is None
    llama = CallMetrics()
    read_timings({"prompt_n": U64_MAX, "cache_n": U64_MAX}, llama)
    assert (llama.evaluated_tokens, llama.cached_tokens) == (MAX_COUNT, MAX_COUNT)
    progress = CallMetrics()
    read_progress({"total": U64_MAX, "cache": 5}, progress)
    assert progress.prompt_tokens == MAX_COUNT
    claude = CallMetrics()
    anthropic_usage(
        {
            "input_tokens": U64_MAX,
            "cache_creation_input_tokens": U64_MAX,
            "cache_read_input_tokens": U64_MAX,
            "output_tokens": U64_MAX,
        },
        claude,
    )
    assert claude.prompt_tokens == 3 * MAX_COUNT < 2**63
    assert claude.completion_tokens == MAX_COUNT
    gemini = CallMetrics()
    gemini_usage({"promptTokenCount": U64_MAX, "toolUsePromptTokenCount": U64_MAX}, gemini)
    assert gemini.prompt_tokens == 2 * MAX_COUNT < 2**63


def _poisoned_batch() -> list[Any]:
    """Five records of five callers; the third has counts no sink can hold, the fourth one
    only the call log can (orjson writes up to 2**64 - 1, SQLite up to 2**63 - 1)."""
    records = [make_record(i, task=f"caller-{i}") for i in range(5)]
    records[2].prompt_tokens = 10**30
    records[3].completion_tokens = 2**63
    return records


def test_a_poisoned_record_costs_only_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls_path, ledger_path = tmp_path / "calls.jsonl", tmp_path / "ledger.db"
    writer = MeterWriter(calls_path, ledger_path)
    for record in _poisoned_batch():
        writer.submit(record)  # all queued before the thread starts: one batch
    with caplog.at_level(logging.ERROR, logger="boundedcode_gateway.metering.writer"):
        writer.start()
        assert writer.flush(5.0)
        writer.close()
    logged = [line["call_id"] for line in log_lines(calls_path)]
    assert logged == ["call-00000", "call-00001", "call-00003", "call-00004"]
    stored = [row["call_id"] for row in ledger_rows(ledger_path)]
    assert stored == ["call-00000", "call-00001", "call-00004"]
    assert writer.set_aside == 3  # call 2 by both sinks, call 3 by the ledger
    assert writer.errors == 0
    assert writer.written == 4  # call 2 reached neither sink
    messages = [r.getMessage() for r in caplog.records]
    assert any("call-00002" in m and "1000000000000000000000000000000" in m for m in messages)
    assert any("ledger cannot hold call call-00003" in m for m in messages)


def test_the_ledger_inserts_a_poisoned_batch_row_by_row(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.open()
    try:
        rejected = ledger.insert(_poisoned_batch())
        again = ledger.insert([make_record(0, task="again")])  # a call id already there
    finally:
        ledger.close()
    assert [(r.call_id, type(e).__name__) for r, e in rejected] == [
        ("call-00002", "OverflowError"),
        ("call-00003", "OverflowError"),
    ]
    assert [(r.call_id, type(e).__name__) for r, e in again] == [("call-00000", "IntegrityError")]
    assert len(ledger_rows(tmp_path / "ledger.db")) == 3


def test_a_sync_writer_resolves_each_records_future_once_written(tmp_path: Path) -> None:
    calls_path, ledger_path = tmp_path / "calls.jsonl", tmp_path / "ledger.db"
    writer = MeterWriter(calls_path, ledger_path, sync=True)
    queued = writer.submit(make_record(1))
    assert queued is not None and not queued.done()  # nothing writes before start()
    writer.start()
    queued.result(timeout=5)
    assert [row["call_id"] for row in ledger_rows(ledger_path)] == ["call-00001"]
    assert [line["call_id"] for line in log_lines(calls_path)] == ["call-00001"]
    writer.close()
    assert writer.submit(make_record(2)) is None  # closed: dropped, nothing to wait for
    assert MeterWriter(calls_path, ledger_path).submit(make_record(3)) is None  # not sync


def test_a_future_no_answer_waits_for_any_more_does_not_stop_the_writer(tmp_path: Path) -> None:
    calls_path, ledger_path = tmp_path / "calls.jsonl", tmp_path / "ledger.db"
    writer = MeterWriter(calls_path, ledger_path, sync=True)
    gone = writer.submit(make_record(1))
    # what asyncio does to it when the answer waiting on it is cancelled (its caller left)
    assert gone is not None and gone.cancel()
    writer.start()
    later = writer.submit(make_record(2))
    assert later is not None
    later.result(timeout=5)
    writer.close()
    assert [row["call_id"] for row in ledger_rows(ledger_path)] == ["call-00001", "call-00002"]
    assert [line["call_id"] for line in log_lines(calls_path)] == ["call-00001", "call-00002"]
