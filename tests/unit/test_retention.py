"""Retention: task folders idle for ``task_days`` removed (at start, then daily, off the loop),
and the call log rotated by the writer thread, ``call_log_files`` of it kept and still read."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import orjson

from boundedcode_gateway import jsonl
from boundedcode_gateway.config import RetentionSettings, parse_config
from boundedcode_gateway.metering.calllog import log_files, read_calls, read_tail, rotated
from boundedcode_gateway.metering.writer import MeterWriter
from boundedcode_gateway.policy.history_diff import HistoryTracker
from boundedcode_gateway.providers.registry import REASONING_FILES
from boundedcode_gateway.reasoning_store.store import ReasoningStore, remove_idle_folders
from boundedcode_gateway.retention import DAY_S, IdleTaskSweeper
from boundedcode_gateway.state.backends import FileTaskState
from tests.unit.test_metering import ledger_rows, make_record

KIND = "reasoning_content"
NOW = 1_800_000_000.0  # the injected wall clock


def task_folder(tasks_dir: Path, name: str, age_days: float) -> Path:
    """A task folder whose file was last written ``age_days`` before ``NOW``."""
    folder = tasks_dir / name
    folder.mkdir(parents=True)
    line = orjson.dumps({"key": "text:1", "provider": "local", "profile": "p", "data": name})
    (folder / "local-replay.jsonl").write_bytes(line + b"\n")
    written = NOW - age_days * DAY_S
    os.utime(folder / "local-replay.jsonl", (written, written))
    return folder


def test_folders_idle_since_the_cutoff_are_removed(tmp_path: Path) -> None:
    old = task_folder(tmp_path, "old", 31)
    young = task_folder(tmp_path, "young", 29)
    (tmp_path / "a-file").write_text("not a task folder")
    assert remove_idle_folders(tmp_path, NOW - 30 * DAY_S) == ["old"]
    assert not old.exists() and young.exists() and (tmp_path / "a-file").exists()
    assert remove_idle_folders(tmp_path / "missing", NOW) == []


async def gone(path: Path, within_s: float = 30.0) -> None:
    """Wait until ``path`` is removed (by the store's own thread), up to ``within_s``: a
    loaded machine may take seconds to run a pass."""
    deadline = time.monotonic() + within_s
    while path.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


async def test_the_sweeper_removes_idle_folders_at_start_and_then_daily(tmp_path: Path) -> None:
    store = ReasoningStore(tmp_path, REASONING_FILES)
    tasks_dir = tmp_path / "tasks"
    task_folder(tasks_dir, "old", 40)
    task_folder(tasks_dir, "young", 1)
    loaded = await store.task("old")
    assert loaded.find(KIND, ["text:1"]) is not None
    clock = [NOW]
    sweeper = IdleTaskSweeper(
        FileTaskState(store, HistoryTracker()),
        task_days=30,
        wall_clock=lambda: clock[0],
        every_s=0.01,
    )
    running = asyncio.ensure_future(sweeper.run())
    try:
        await gone(tasks_dir / "old")  # the pass at start
        assert not (tasks_dir / "old").exists()
        assert store.get("old", KIND, "text:1") is None  # forgotten in memory as well
        assert (tasks_dir / "young").exists()
        clock[0] += 30 * DAY_S  # a month later, the next pass takes the young one too
        await gone(tasks_dir / "young")
        assert not (tasks_dir / "young").exists()
    finally:
        running.cancel()
        store.close()


async def test_a_task_written_to_is_kept(tmp_path: Path) -> None:
    store = ReasoningStore(tmp_path, REASONING_FILES)
    task_folder(tmp_path / "tasks", "busy", 40)
    (await store.task("busy")).keep(KIND, ["text:2"], "local", "p", "new")
    sweeper = IdleTaskSweeper(FileTaskState(store, HistoryTracker()), task_days=30)
    # the append is queued before the sweep on the same thread: the folder is written now
    assert await sweeper.sweep() == []
    store.close()
    again = ReasoningStore(tmp_path, REASONING_FILES)
    assert (await again.task("busy")).find(KIND, ["text:1"]) is not None
    again.close()


def test_the_call_log_is_rotated_and_every_kept_file_read(tmp_path: Path) -> None:
    calls, ledger = tmp_path / "calls.jsonl", tmp_path / "ledger.db"
    writer = MeterWriter(calls, ledger, rotate_bytes=2000, rotated_files=2)
    writer.start()
    for i in range(40):
        writer.submit(make_record(i))
        assert writer.flush(5.0)  # one record per batch: a rotation can fall between any two
    writer.close()
    assert [p.name for p in log_files(calls)] == ["calls.jsonl.2", "calls.jsonl.1", "calls.jsonl"]
    assert not rotated(calls, 3).exists()
    assert all(p.stat().st_size < 2000 + 1000 for p in log_files(calls))
    kept = [c["call_id"] for c in read_calls(calls)]
    assert kept == [f"call-{i:05d}" for i in range(40 - len(kept), 40)]  # the newest, in order
    assert 3 < len(kept) < 40
    assert len(ledger_rows(ledger)) == 40  # the ledger is not rotated
    tail = [c["call_id"] for c in read_tail(calls, 4000)]
    assert tail == kept[-len(tail) :]
    current = [c["call_id"] for c in jsonl.read_objects(calls)]
    newest_rotated = [c["call_id"] for c in jsonl.read_objects(rotated(calls, 1))]
    # the log was rotated a moment ago: a start reads the end of calls.jsonl.1 as well
    assert len(tail) > len(current) and set(tail) - set(current) <= set(newest_rotated)


def test_without_a_size_the_call_log_is_not_rotated(tmp_path: Path) -> None:
    calls = tmp_path / "calls.jsonl"
    writer = MeterWriter(calls, tmp_path / "ledger.db")
    writer.start()
    for i in range(20):
        writer.submit(make_record(i))
    writer.close()
    assert log_files(calls) == [calls]


def test_retention_settings() -> None:
    models = "models:\n  m: {provider: openai-compatible, base_url: 'http://127.0.0.1:1/v1'}\n"
    default = parse_config(models).retention
    assert default == RetentionSettings()
    assert (default.task_days, default.call_log_bytes, default.tasks_in_memory) == (
        None,
        None,
        4096,
    )
    assert default.task_idle_s == 86400
    config = parse_config(
        "retention: {task_days: 30, call_log_mib: 512, call_log_files: 2, task_idle_s: null}\n"
        + models
    )
    assert config.retention.call_log_bytes == 512 * 1024 * 1024
    assert config.retention.task_idle_s is None
