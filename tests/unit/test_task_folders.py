"""Task folders keep ids that differ only in case apart, as a filesystem that folds case
(macOS's, Windows') would not with the id as the name; folders of the earlier naming are
renamed once and their reasoning found."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.call_context import TASK_ID
from boundedcode_gateway.providers.registry import REASONING_FILES
from boundedcode_gateway.reasoning_store import folders
from boundedcode_gateway.reasoning_store.folders import (
    folder_name,
    rename_earlier_folders,
    task_of,
)
from boundedcode_gateway.reasoning_store.store import ReasoningStore, remove_idle_folders

KIND = "reasoning_content"
REPLAY = REASONING_FILES[KIND]

task_ids = st.from_regex(TASK_ID, fullmatch=True).filter(lambda t: t not in (".", ".."))


@st.composite
def recased(draw: st.DrawFn) -> tuple[str, str]:
    """An id and another of the same letters, some of them in the other case."""
    task = draw(task_ids)
    flips = draw(st.lists(st.booleans(), min_size=len(task), max_size=len(task)))
    other = "".join(c.swapcase() if f else c for c, f in zip(task, flips, strict=True))
    return task, other


@given(st.one_of(recased(), st.tuples(task_ids, task_ids)))
def test_different_ids_never_share_a_folder_under_case_folding(pair: tuple[str, str]) -> None:
    a, b = pair
    if a != b:
        assert folder_name(a).casefold() != folder_name(b).casefold()
        assert folder_name(a).lower() != folder_name(b).lower()


@given(task_ids)
def test_a_folder_name_is_lower_case_a_name_any_filesystem_takes_and_reads_back(
    task: str,
) -> None:
    name = folder_name(task)
    assert name == name.lower() and name.isascii()
    assert "/" not in name and "\\" not in name and name not in (".", "..")
    assert len(name) <= 161
    assert task_of(name) == task
    if task == task.lower():
        assert name == task  # every folder written before keeps its name


def test_the_names_read_as_documented() -> None:
    assert folder_name("build") == "build"
    assert folder_name("Build") == "build+1"
    assert folder_name("MyTask") == "mytask+5"
    assert folder_name("A" * 128) == "a" * 128 + "+" + "f" * 32
    assert task_of("build+2") == "bUild"
    # names no task has are read back as they are
    for name in ["build+20", "b1+2", "build+zz", "build+", "Build", "build+01", "x+-1"]:
        assert task_of(name) == name


def line(data: str, key: str = "text:1") -> bytes:
    return orjson.dumps({"keys": [key], "provider": "local", "profile": "p", "data": data}) + b"\n"


def earlier_folder(tasks_dir: Path, task: str, data: str) -> Path:
    """A task folder as an earlier gateway wrote it: named by the id itself."""
    folder = tasks_dir / task
    folder.mkdir(parents=True)
    (folder / REPLAY).write_bytes(line(data))
    return folder


async def test_ids_that_differ_in_case_keep_their_own_reasoning(tmp_path: Path) -> None:
    store = ReasoningStore(tmp_path, REASONING_FILES)
    for task in ["build", "Build", "BUILD"]:
        (await store.task(task)).keep(KIND, ["text:1"], "local", "p", f"of {task}")
    await store.aclose()
    names = sorted(p.name for p in (tmp_path / "tasks").iterdir())
    assert names == ["build", "build+1", "build+1f"]
    assert len({n.casefold() for n in names}) == 3
    again = ReasoningStore(tmp_path, REASONING_FILES)
    for task in ["build", "Build", "BUILD"]:
        item = (await again.task(task)).find(KIND, ["text:1"])
        assert item is not None and item.data == f"of {task}"
    await again.aclose()


async def test_reasoning_stored_under_the_earlier_naming_is_found(tmp_path: Path) -> None:
    tasks_dir = tmp_path / "tasks"
    earlier_folder(tasks_dir, "Build", "of Build")
    earlier_folder(tasks_dir, "build", "of build")
    earlier_folder(tasks_dir, "MyTask", "of MyTask")
    store = ReasoningStore(tmp_path, REASONING_FILES)
    for task in ["Build", "build", "MyTask"]:
        item = (await store.task(task)).find(KIND, ["text:1"])
        assert item is not None and item.data == f"of {task}"
    assert (await store.task("mytask")).find(KIND, ["text:1"]) is None
    # what the task adds goes where its reasoning now is
    (await store.task("Build")).keep(KIND, ["text:2"], "local", "p", "more")
    await store.aclose()
    assert sorted(p.name for p in tasks_dir.iterdir()) == ["build", "build+1", "mytask+5"]
    assert (tasks_dir / "build+1" / REPLAY).read_bytes().count(b"\n") == 2
    assert (tasks_dir / "build" / REPLAY).read_bytes() == line("of build")


def test_an_earlier_folder_whose_new_name_is_taken_is_left_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    earlier = earlier_folder(tmp_path, "Build", "earlier")
    (tmp_path / "build+1").mkdir()
    with caplog.at_level(logging.WARNING):
        assert rename_earlier_folders(tmp_path) == 0
    assert (earlier / REPLAY).read_bytes() == line("earlier")
    assert "is of the earlier naming, and" in caplog.text
    assert rename_earlier_folders(tmp_path / "missing") == 0


def test_only_folders_of_the_earlier_naming_are_renamed(tmp_path: Path) -> None:
    earlier_folder(tmp_path, "Build", "earlier")
    (tmp_path / "Notes").write_text("a file, not a task folder")
    (tmp_path / "My Notes").mkdir()  # no task's: a space
    earlier_folder(tmp_path, "mytask+5", "now")
    assert rename_earlier_folders(tmp_path) == 1
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["My Notes", "Notes", "build+1", "mytask+5"]
    assert rename_earlier_folders(tmp_path) == 0


def test_retention_names_the_tasks_it_removes(tmp_path: Path) -> None:
    for task in ["MyTask", "mytask"]:
        folder = tmp_path / folder_name(task)
        folder.mkdir()
        (folder / REPLAY).write_bytes(line(task))
    assert sorted(remove_idle_folders(tmp_path, float("inf"))) == ["MyTask", "mytask"]


@given(task_ids)
def test_the_folders_know_the_ids_ingress_lets_in(task: str) -> None:
    # one pattern (call_context.py) for the ids ingress lets in and the folders it made:
    # any such id with an upper-case letter may be a folder of the earlier naming
    assert folders._of_earlier_naming(task) == (task != task.lower())
