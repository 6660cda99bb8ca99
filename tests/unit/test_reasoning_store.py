"""The replay file: persistence, a crash mid-write, concurrent appends."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from boundedcode_gateway.reasoning_store.store import ReasoningStore


async def test_items_survive_a_restart(tmp_path: Path) -> None:
    store = ReasoningStore(tmp_path)
    task = await store.task("t1")
    task.keep("reasoning_content", ["text:a", "text:b"], "local", "qwen", "because")
    assert task.find("reasoning_content", ["text:b"]).data == "because"  # type: ignore[union-attr]
    store.close()
    again = await ReasoningStore(tmp_path).task("t1")
    item = again.find("reasoning_content", ["nope", "text:a"])
    assert item is not None
    assert (item.provider, item.profile, item.data) == ("local", "qwen", "because")
    assert (tmp_path / "tasks" / "t1" / "local-replay.jsonl").is_file()


async def test_partial_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "tasks" / "t" / "local-replay.jsonl"
    path.parent.mkdir(parents=True)
    good = orjson.dumps({"key": "text:1", "provider": "local", "profile": "p", "data": "ok"})
    path.write_bytes(good + b"\n" + b'{"key": "text:2", "provid')
    store = ReasoningStore(tmp_path)
    task = await store.task("t")
    assert task.find("reasoning_content", ["text:1"]) is not None
    assert task.find("reasoning_content", ["text:2"]) is None
    task.keep("reasoning_content", ["text:3"], "local", "p", "new")
    store.close()
    lines = path.read_bytes().splitlines()
    assert orjson.loads(lines[-1])["key"] == "text:3"  # started on a fresh line
    again = await ReasoningStore(tmp_path).task("t")
    assert again.find("reasoning_content", ["text:3"]) is not None


async def test_concurrent_appends_do_not_interleave(tmp_path: Path) -> None:
    store = ReasoningStore(tmp_path)
    task = await store.task("busy")
    long = "x" * 20_000

    async def one(i: int) -> None:
        await asyncio.sleep(0)
        task.keep("reasoning_content", [f"text:{i}"], "local", "p", f"{i}:{long}")

    await asyncio.gather(*(one(i) for i in range(200)))
    store.close()
    lines = (tmp_path / "tasks" / "busy" / "local-replay.jsonl").read_bytes().splitlines()
    assert len(lines) == 200
    assert sorted(int(orjson.loads(line)["data"].split(":")[0]) for line in lines) == list(
        range(200)
    )


async def test_calls_without_a_task_share_the_default(tmp_path: Path) -> None:
    store = ReasoningStore(tmp_path)
    (await store.task("default")).keep("reasoning_content", ["text:z"], "local", "p", "r")
    assert (await store.task("default")).find("reasoning_content", ["text:z"]) is not None
    assert (await store.task("other")).find("reasoning_content", ["text:z"]) is None
    store.close()
