"""The slot files on disk (llama_server/slot_store.py): a saved slot moves into the store
with its description, the store holds its byte budget by dropping the least recently
used, a file is checked whole before it is linked for a restore, everything is the
gateway user's alone, and a restarted gateway finds what was saved."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from boundedcode_gateway.llama_server.slot_store import (
    STATE_MAGIC,
    Saving,
    SlotStore,
    slot_file_name,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def saved_by_server(folder: Path, name: str, size: int = 100) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.save.slot"
    path.write_bytes(STATE_MAGIC + bytes(size - len(STATE_MAGIC)))
    return path


def adopt(store: SlotStore, server: Path, name: str, task: str = "t", size: int = 100) -> None:
    saved = saved_by_server(server, name, size)
    asyncio.run(store.adopt(saved, Saving(name, task, "id-1", 40, 30)))


def test_a_saved_slot_moves_into_the_store_owner_only(tmp_path: Path) -> None:
    store = SlotStore(tmp_path / "store", 10_000)
    adopt(store, tmp_path / "server", "a")
    assert list((tmp_path / "server").iterdir()) == []
    entry = store.get("a")
    assert entry is not None and (entry.tokens, entry.prefix_tokens, entry.size) == (40, 30, 100)
    for path in (tmp_path / "store").iterdir():
        assert os.stat(path).st_mode & 0o777 == 0o600, path
    assert os.stat(tmp_path / "store").st_mode & 0o777 == 0o700


def test_the_least_recently_used_files_go_to_keep_the_budget(tmp_path: Path) -> None:
    store = SlotStore(tmp_path / "store", 250, wall_clock=Clock())
    server = tmp_path / "server"
    adopt(store, server, "a")
    adopt(store, server, "b")
    # a is used (restored) after b was saved: b is now the least recent
    assert not isinstance(asyncio.run(store.check_out("a", "id-1", server)), str)
    adopt(store, server, "c")
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None
    assert store.totals().bytes <= 250
    assert not (tmp_path / "store" / "b.slot").exists()


def test_a_file_larger_than_the_whole_budget_is_not_kept(tmp_path: Path) -> None:
    store = SlotStore(tmp_path / "store", 50)
    adopt(store, tmp_path / "server", "big")
    assert store.get("big") is None and store.totals().bytes == 0


@pytest.mark.parametrize(
    ("spoil", "refusal"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:50]), "cut"),
        (lambda p: p.write_bytes(p.read_bytes()[:-1] + b"x"), "corrupt"),
        (lambda p: p.write_bytes(b"junk" + p.read_bytes()[4:]), "foreign"),
        (lambda p: p.unlink(), "missing"),
    ],
)
def test_a_spoiled_file_is_refused_by_name(tmp_path: Path, spoil: object, refusal: str) -> None:
    store = SlotStore(tmp_path / "store", 10_000)
    server = tmp_path / "server"
    adopt(store, server, "a")
    spoil(tmp_path / "store" / "a.slot")  # type: ignore[operator]
    assert asyncio.run(store.check_out("a", "id-1", server)) == refusal
    assert list(server.iterdir()) == []


def test_a_file_of_another_server_is_refused_and_kept(tmp_path: Path) -> None:
    store = SlotStore(tmp_path / "store", 10_000)
    server = tmp_path / "server"
    adopt(store, server, "a")
    assert asyncio.run(store.check_out("a", "id-2", server)) == "mismatched"
    assert store.get("a") is not None


def test_a_checked_out_file_is_linked_then_removed_from_the_servers_folder(
    tmp_path: Path,
) -> None:
    store = SlotStore(tmp_path / "store", 10_000)
    server = tmp_path / "server"
    adopt(store, server, "a")
    checked = asyncio.run(store.check_out("a", "id-1", server))
    assert not isinstance(checked, str)
    entry, linked = checked
    assert (server / linked).read_bytes() == (tmp_path / "store" / "a.slot").read_bytes()
    assert os.stat(server / linked).st_mode & 0o777 == 0o600
    asyncio.run(store.check_in(server, linked))
    assert list(server.iterdir()) == []
    assert entry.name == "a"


def test_a_restarted_gateway_finds_the_files_and_drops_what_is_half_there(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    store = SlotStore(folder, 10_000)
    adopt(store, tmp_path / "server", "a", task="task-a")
    adopt(store, tmp_path / "server", "b")
    (folder / "b.json").unlink()  # a save cut short before its description
    (folder / "c.json").write_bytes(b"{not json")
    again = SlotStore(folder, 10_000)
    asyncio.run(again.load())
    assert again.get("a") is not None and again.get("a").task == "task-a"  # type: ignore[union-attr]
    assert again.get("b") is None and not (folder / "b.slot").exists()
    assert not (folder / "c.json").exists()


def test_files_go_with_their_tasks_and_when_idle_past_retention(tmp_path: Path) -> None:
    store = SlotStore(tmp_path / "store", 10_000, wall_clock=Clock())
    server = tmp_path / "server"
    adopt(store, server, "a", task="one")
    adopt(store, server, "b", task="two")
    adopt(store, server, "c", task="three")
    assert asyncio.run(store.remove_tasks(["two"])) == 1
    assert store.tasks() == {"one", "three"}
    cutoff = store.get("c").used_at  # type: ignore[union-attr]
    assert asyncio.run(store.remove_idle_tasks(cutoff)) == ["one"]
    assert store.tasks() == {"three"}


def test_file_names_are_digests_that_tell_case_apart() -> None:
    a = slot_file_name("m", "", "Task", "agent", "1")
    b = slot_file_name("m", "", "task", "agent", "1")
    assert a != b and a.isalnum() and len(a) == 40
    assert slot_file_name("m", "", "../x", "p", "").isalnum()
