"""The replay file: persistence, a crash mid-write, appends from several writers at once."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import tracemalloc
from multiprocessing.synchronize import Barrier as BarrierType
from pathlib import Path

import orjson

from boundedcode_gateway.call_context import TASK_SCOPE
from boundedcode_gateway.providers.registry import REASONING_FILES
from boundedcode_gateway.reasoning_store.store import ReasoningStore


async def test_items_survive_a_restart(tmp_path: Path) -> None:
    store = ReasoningStore(tmp_path, REASONING_FILES)
    task = await store.task("t1")
    task.keep("reasoning_content", ["text:a", "text:b"], "local", "qwen", "because")
    assert task.find("reasoning_content", ["text:b"]).data == "because"  # type: ignore[union-attr]
    store.close()
    again = await ReasoningStore(tmp_path, REASONING_FILES).task("t1")
    item = again.find("reasoning_content", ["nope", "text:a"])
    assert item is not None
    assert (item.provider, item.profile, item.data) == ("local", "qwen", "because")
    assert (tmp_path / "tasks" / "t1" / "local-replay.jsonl").is_file()


async def test_partial_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "tasks" / "t" / "local-replay.jsonl"
    path.parent.mkdir(parents=True)
    good = orjson.dumps({"key": "text:1", "provider": "local", "profile": "p", "data": "ok"})
    path.write_bytes(good + b"\n" + b'{"key": "text:2", "provid')
    store = ReasoningStore(tmp_path, REASONING_FILES)
    task = await store.task("t")
    assert task.find("reasoning_content", ["text:1"]) is not None
    assert task.find("reasoning_content", ["text:2"]) is None
    task.keep("reasoning_content", ["text:3"], "local", "p", "new")
    store.close()
    lines = path.read_bytes().splitlines()
    assert orjson.loads(lines[-1])["keys"] == ["text:3"]  # started on a fresh line
    again = await ReasoningStore(tmp_path, REASONING_FILES).task("t")
    assert again.find("reasoning_content", ["text:3"]) is not None


LONG = "x" * 20_000  # each line far beyond one write buffer
WRITERS = 4
LINES_EACH = 300


def append_from_a_store_of_its_own(
    data_dir: Path, writer: int, start: threading.Barrier | BarrierType
) -> None:
    """One writer: its own store (so its own appender thread) on the shared data folder,
    as two gateways on one folder would be."""
    store = ReasoningStore(data_dir, REASONING_FILES)
    task = asyncio.run(store.task("busy"))
    start.wait(timeout=60)
    for i in range(LINES_EACH):
        task.keep("reasoning_content", [f"text:{writer}:{i}"], "local", "p", f"{writer}:{i}:{LONG}")
    store.close()


def assert_every_line_whole(data_dir: Path) -> None:
    raw = (data_dir / "tasks" / "busy" / "local-replay.jsonl").read_bytes()
    # A writer that opens the file while another's line is half on disk takes it for a
    # line cut by a crash and starts afresh: an empty line, which readers skip. Every
    # other line must be one writer's whole line.
    lines = [line for line in raw.splitlines() if line]
    written = sorted(tuple(orjson.loads(line)["data"].split(":")[:2]) for line in lines)
    expected = sorted((str(w), str(i)) for w in range(WRITERS) for i in range(LINES_EACH))
    assert written == expected
    task = asyncio.run(ReasoningStore(data_dir, REASONING_FILES).task("busy"))
    for w in range(WRITERS):
        for i in range(LINES_EACH):
            item = task.find("reasoning_content", [f"text:{w}:{i}"])
            assert item is not None and item.data == f"{w}:{i}:{LONG}"


def test_appends_from_several_threads_do_not_interleave(tmp_path: Path) -> None:
    start = threading.Barrier(WRITERS)
    threads = [
        threading.Thread(target=append_from_a_store_of_its_own, args=(tmp_path, w, start))
        for w in range(WRITERS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert_every_line_whole(tmp_path)


def test_appends_from_several_processes_do_not_interleave(tmp_path: Path) -> None:
    spawn = multiprocessing.get_context("spawn")
    start = spawn.Barrier(WRITERS)
    procs = [
        spawn.Process(target=append_from_a_store_of_its_own, args=(tmp_path, w, start))
        for w in range(WRITERS)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0] * WRITERS
    assert_every_line_whole(tmp_path)


async def test_calls_without_a_task_share_the_default(tmp_path: Path) -> None:
    store = ReasoningStore(tmp_path, REASONING_FILES)
    (await store.task("default")).keep("reasoning_content", ["text:z"], "local", "p", "r")
    assert (await store.task("default")).find("reasoning_content", ["text:z"]) is not None
    assert (await store.task("other")).find("reasoning_content", ["text:z"]) is None
    store.close()


WIDE_KEYS = [f"tool:call_{i}" for i in range(400)]
WIDE_TEXT = "".join(f"thought {i}; " for i in range(40_000))  # about 470 KB


def lines_of(data_dir: Path, task: str) -> list[dict[str, object]]:
    raw = (data_dir / "tasks" / task / "local-replay.jsonl").read_bytes()
    return [orjson.loads(line) for line in raw.splitlines() if line]


async def test_an_answer_with_many_keys_is_one_line_and_one_item(tmp_path: Path) -> None:
    store = ReasoningStore(tmp_path, REASONING_FILES)
    task = await store.task("t")
    task.keep("reasoning_content", WIDE_KEYS, "local", "qwen", WIDE_TEXT)
    held = task.find("reasoning_content", [WIDE_KEYS[0]])
    assert held is not None and held.keys == tuple(WIDE_KEYS)
    # every key finds the one item: no copy of the text per key, in memory or in weight
    assert all(task.find("reasoning_content", [k]) is held for k in WIDE_KEYS)
    assert store._items.weight < 2 * len(WIDE_TEXT)
    store.close()
    [line] = lines_of(tmp_path, "t")
    assert line["keys"] == WIDE_KEYS and line["data"] == WIDE_TEXT
    assert (tmp_path / "tasks" / "t" / "local-replay.jsonl").stat().st_size < 2 * len(WIDE_TEXT)
    # read back: one item again, under each key
    again = await ReasoningStore(tmp_path, REASONING_FILES).task("t")
    first = again.find("reasoning_content", [WIDE_KEYS[0]])
    assert first is not None and first.data == WIDE_TEXT and first.keys == tuple(WIDE_KEYS)
    assert all(again.find("reasoning_content", [k]) is first for k in WIDE_KEYS)


def old_line(key: str, data: str, profile: str = "qwen") -> bytes:
    """A line of the earlier form: one key, with its own copy of the turn's reasoning."""
    record = {"key": key, "provider": "local", "profile": profile, "data": data}
    return orjson.dumps(record) + b"\n"


async def test_a_file_of_the_earlier_form_loads_with_each_text_held_once(tmp_path: Path) -> None:
    path = tmp_path / "tasks" / "t" / "local-replay.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(
        b"".join(old_line(k, "wide answer") for k in ["tool:a", "tool:b", "tool:c"])
        + old_line("tool:d", "wide answer", profile="other")  # another writer: its own
        + old_line("text:1", "short answer")
        + old_line("tool:b", "tool b again")  # kept again later: the newer wins
    )
    store = ReasoningStore(tmp_path, REASONING_FILES)
    task = await store.task("t")
    a = task.find("reasoning_content", ["tool:a"])
    assert a is not None and a.data == "wide answer" and a.keys == ("tool:a", "tool:b", "tool:c")
    assert task.find("reasoning_content", ["tool:c"]) is a
    d = task.find("reasoning_content", ["tool:d"])
    assert d is not None and (d.profile, d.data) == ("other", "wide answer")
    found = task.find("reasoning_content", ["text:1"])
    assert found is not None and found.data == "short answer"
    found = task.find("reasoning_content", ["tool:b"])
    assert found is not None and found.data == "tool b again"
    # a new answer after the old lines: written in the new form, and the newer wins
    task.keep("reasoning_content", ["tool:c", "tool:e"], "local", "qwen", "new answer")
    store.close()
    assert lines_of(tmp_path, "t")[-1]["keys"] == ["tool:c", "tool:e"]
    again = await ReasoningStore(tmp_path, REASONING_FILES).task("t")
    found = again.find("reasoning_content", ["tool:c"])
    assert found is not None and found.data == "new answer"
    assert again.find("reasoning_content", ["tool:a"]) == a


async def test_a_file_of_many_copies_loads_into_one_copy(tmp_path: Path) -> None:
    """The earlier form of one answer of 400 tool calls: 400 lines, each a copy of its
    reasoning (235 MB). Loaded, memory holds the text once, and the task weighs one line."""
    path = tmp_path / "tasks" / "t" / "local-replay.jsonl"
    path.parent.mkdir(parents=True)
    with path.open("wb") as f:
        for key in WIDE_KEYS:
            f.write(old_line(key, WIDE_TEXT))
    store = ReasoningStore(tmp_path, REASONING_FILES)
    tracemalloc.start()
    try:
        items, weight = store._load("t")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # a line and its parse at a time (orjson's, about 15 lines' worth), not 400 copies
    assert peak < 32 << 20, f"{peak:,} bytes at the most"
    assert weight < 2 * len(WIDE_TEXT)
    assert len({id(item) for item in items.values()}) == 1
    assert {key for _, _, key in items} == set(WIDE_KEYS)


async def test_each_scope_keeps_its_own_and_lines_of_before_scopes_are_the_task_s(
    tmp_path: Path,
) -> None:
    """A line without a scope (written before scopes) belongs to everyone on the task; a
    caller key's items are found by its scope only, also once read back from the file."""
    path = tmp_path / "tasks" / "t" / "local-replay.jsonl"
    path.parent.mkdir(parents=True)
    old = {"keys": ["tool:a"], "provider": "local", "profile": "p", "data": "old"}
    path.write_bytes(orjson.dumps(old) + b"\n")
    store = ReasoningStore(tmp_path, REASONING_FILES)
    alice = await store.task("t", "key:alice")
    assert alice.find("reasoning_content", ["tool:a"]) is None
    alice.keep("reasoning_content", ["tool:a"], "local", "p", "alice's")
    assert (await store.task("t", "key:bob")).find("reasoning_content", ["tool:a"]) is None
    store.close()
    for again in (store, ReasoningStore(tmp_path, REASONING_FILES)):
        shared = (await again.task("t", TASK_SCOPE)).find("reasoning_content", ["tool:a"])
        own = (await again.task("t", "key:alice")).find("reasoning_content", ["tool:a"])
        assert shared is not None and shared.data == "old"
        assert own is not None and (own.data, own.scope) == ("alice's", "key:alice")
        assert (await again.task("t", "key:bob")).find("reasoning_content", ["tool:a"]) is None
        again.close()
    assert orjson.loads(path.read_bytes().splitlines()[-1])["scope"] == "key:alice"
