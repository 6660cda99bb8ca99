"""Per-task state in memory is bounded: each table forgets its least recently used task past
its size, and any task idle too long; a forgotten task behaves as the docs say on its next
call (``changed: -1``, ``first_call``, its reasoning read again from its folder)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from boundedcode_gateway.lru import IdleLru
from boundedcode_gateway.policy.cache_misses import ContinuityTable, PreviousCall
from boundedcode_gateway.policy.history_diff import GREW_ONLY, HistoryTracker
from boundedcode_gateway.providers.registry import REASONING_FILES
from boundedcode_gateway.reasoning_store import store as store_module
from boundedcode_gateway.reasoning_store.store import ReasoningStore

KIND = "reasoning_content"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_least_recently_used_goes_first() -> None:
    clock = FakeClock()
    table: IdleLru[str, int] = IdleLru(3, clock=clock)
    for key in "abc":
        table.put(key, ord(key))
    assert table.get("a") == ord("a")  # a is now the most recent
    assert table.peek("b") == ord("b")  # a peek is no use
    table.put("d", 4)
    assert list(table) == ["c", "a", "d"]


def test_an_idle_entry_is_forgotten() -> None:
    clock = FakeClock()
    table: IdleLru[str, int] = IdleLru(10, idle_s=60, clock=clock)
    table.put("old", 1)
    clock.now += 30
    table.put("young", 2)
    clock.now += 31
    assert table.get("young") == 2
    assert "old" not in table
    clock.now += 60
    assert table.forget_idle() == ["young"]
    assert len(table) == 0


def test_weight_is_bounded_and_grows_in_place() -> None:
    table: IdleLru[str, str] = IdleLru(10, clock=FakeClock(), max_weight=100)
    table.put("a", "a", 40)
    table.put("b", "b", 40)
    table.grow("a", 30)  # a: 70, b: 40 → a, the least recently used, goes
    assert list(table) == ["b"] and table.weight == 40
    table.put("huge", "h", 1000)  # the newest stays whatever its weight
    assert list(table) == ["huge"] and table.weight == 1000


def test_history_forgets_past_its_size_and_idle_time() -> None:
    clock = FakeClock()
    history = HistoryTracker(max_keys=2, idle_s=3600, clock=clock)
    one = [{"role": "user", "content": "a"}]
    two = [*one, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    history.observe("t1", "p", one)
    history.observe("t2", "p", one)
    assert history.observe("t1", "p", [{"role": "user", "content": "other"}]) == 0
    history.observe("t3", "p", one)  # t2 is the least recently used: forgotten
    assert len(history) == 2
    assert history.observe("t2", "p", [{"role": "user", "content": "other"}]) == GREW_ONLY
    clock.now += 3601
    assert history.observe("t1", "p", two) == GREW_ONLY  # idle too long: as after a restart
    assert len(history) == 1


def test_history_bounds_the_digests_it_keeps() -> None:
    history = HistoryTracker(max_keys=100, clock=FakeClock(), max_digests=1000)
    long = [{"role": "user", "content": str(i)} for i in range(600)]
    history.observe("a", "p", long)
    history.observe("b", "p", long)  # 1200 digests: a goes
    assert len(history) == 1
    assert history.observe("a", "p", long) == GREW_ONLY


def test_continuity_forgets_an_idle_conversation() -> None:
    clock = FakeClock()
    table = ContinuityTable(max_keys=10, idle_s=600, clock=clock)
    table.remember(("t", "p", "m", ""), PreviousCall(100, 10, 1))
    clock.now += 599
    assert table.previous(("t", "p", "m", "")) is not None
    clock.now += 601
    assert table.previous(("t", "p", "m", "")) is None  # its next call: first_call
    rebuilt = ContinuityTable.from_call_log(
        [
            {
                "task": f"t{i}",
                "purpose": "p",
                "model_profile": "m",
                "status": "ok",
                "prompt_tokens": 10,
                "completion_tokens": 1,
                "miss_cause": "none",
            }
            for i in range(5)
        ],
        max_keys=3,
    )
    assert len(rebuilt) == 3
    assert rebuilt.previous(("t4", "p", "m", "")) is not None
    assert rebuilt.previous(("t0", "p", "m", "")) is None


async def test_a_forgotten_task_reads_its_reasoning_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    append = store_module._append_line

    def slow_append(path: Path, line: bytes) -> None:
        time.sleep(0.05)  # a busy disk: lines reach the file well after they are kept
        append(path, line)

    monkeypatch.setattr(store_module, "_append_line", slow_append)
    clock = FakeClock()
    store = ReasoningStore(tmp_path, REASONING_FILES, max_tasks=2, idle_s=3600, clock=clock)
    first = await store.task("t1")
    first.keep(KIND, ["text:1"], "local", "p", "one")
    for task in ("t2", "t3"):  # t1 leaves: two tasks at most
        (await store.task(task)).keep(KIND, [f"text:{task}"], "local", "p", task)
    assert store.tasks_in_memory == 2
    assert store.get("t1", KIND, "text:1") is None  # not in memory...
    # ...but a call that held it still finds and keeps its items
    assert first.find(KIND, ["text:1"]) is not None
    first.keep(KIND, ["text:2"], "local", "p", "two")  # queued, maybe not on disk yet
    again = await store.task("t1")  # read from the folder, once the queue is written
    assert again.find(KIND, ["text:1"]).data == "one"  # type: ignore[union-attr]
    assert again.find(KIND, ["text:2"]).data == "two"  # type: ignore[union-attr]
    clock.now += 3601
    later = await store.task("t3")  # every other task idle too long: forgotten
    assert store.tasks_in_memory == 1
    assert later.find(KIND, ["text:t3"]) is not None
    assert store._loading == {}  # no lock left behind per task
    store.close()


async def test_a_task_loaded_by_several_calls_at_once_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ReasoningStore(tmp_path, REASONING_FILES)
    reads: list[str] = []
    load = store._load

    def counted(task: str) -> object:
        reads.append(task)
        return load(task)

    monkeypatch.setattr(store, "_load", counted)
    views = await asyncio.gather(*(store.task("same") for _ in range(5)))
    assert reads == ["same"]
    assert len({id(v._items) for v in views}) == 1
    assert store._loading == {}
    store.close()


async def test_memory_is_bounded_by_the_bytes_of_reasoning(tmp_path: Path) -> None:
    store = ReasoningStore(tmp_path, REASONING_FILES, max_tasks=100, max_bytes=50_000)
    for i in range(10):
        (await store.task(f"t{i}")).keep(KIND, [f"text:{i}"], "local", "p", "x" * 20_000)
    assert store.tasks_in_memory == 2
    store.close()
    again = ReasoningStore(tmp_path, REASONING_FILES, max_bytes=50_000)
    assert (await again.task("t0")).find(KIND, ["text:0"]) is not None
    again.close()
