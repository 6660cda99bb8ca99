"""The host-side reasoning store: one interface for every provider's reasoning.

Items carry task, provider and model profile (reasoning is data with
provenance). Each task's items live in its folder, one append-only JSONL file
per kind, named by the provider that writes the kind (``tasks/<task>/local-replay.jsonl``
for llama.cpp's reasoning text; the folder's name keeps ids that differ only in case
apart, ``folders.py``),
so a resumed run and a restarted gateway keep them. A partial last line from a
crash is skipped. Appends go through one background thread, so lines of
concurrent calls never interleave and the request path never waits on disk.

An answer's reasoning is one item, one line and one object in memory, whatever the
number of keys it is found under (an answer with 400 tool calls has 400): each key of
the task's index points at the same item. Files of the earlier form, one line a key
each with a copy of the reasoning, still load, their copies folded into one item.

Each item belongs to the scope of the caller that kept it (``call_context.py``: a caller
key, the task's tokens, or everyone on the task): a call finds only its own scope's items
and keeps into it alone, so another caller on the task neither reads nor replaces them.
A line written before items had a scope belongs to everyone on the task (``TASK_SCOPE``):
who kept it is not known, so a caller-scoped call does not find it.

This is the backend of a gateway without ``state:``; ``backend.py`` says what every
backend offers.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import orjson

from boundedcode_gateway import jsonl
from boundedcode_gateway.call_context import TASK_SCOPE
from boundedcode_gateway.lru import Clock, IdleLru
from boundedcode_gateway.reasoning_store.folders import (
    folder_name,
    rename_earlier_folders,
    task_of,
)

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReasoningItem:
    """One turn's reasoning, as the provider wrote it, who wrote it, every key it is
    found under (keys.py), and the scope of the callers who find it."""

    kind: str
    keys: tuple[str, ...]
    provider: str
    profile: str
    data: Any
    scope: str = TASK_SCOPE


class _Appender:
    """The one thread that appends lines to the task files, and does whatever else must not
    run between two of its appends (a task folder's removal); ``first``, before them all."""

    def __init__(self, first: Callable[[], object]) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._queue.put(partial(_run_logged, first))
        self._thread = threading.Thread(target=self._run, name="reasoning-appender", daemon=True)
        self._thread.start()

    def append(self, path: Path, line: bytes) -> None:
        self._queue.put(partial(_append_line, path, line))

    def run(self, job: Callable[[], T]) -> Future[T]:
        """``job`` on this thread once the lines queued before it are written."""
        done: Future[T] = Future()

        def run_job() -> None:
            try:
                done.set_result(job())
            except BaseException as exc:
                done.set_exception(exc)

        self._queue.put(run_job)
        return done

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            job()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)


def _run_logged(job: Callable[[], object]) -> None:
    try:
        job()
    except Exception:
        log.exception("the reasoning store's first job failed")


def _append_line(path: Path, line: bytes) -> None:
    try:
        jsonl.append(path, line)
    except OSError:
        log.exception("cannot append to %s", path)


def _read_items(path: Path, kind: str) -> list[ReasoningItem]:
    """The file's items, oldest first: a line is one item with its keys. Consecutive lines
    of the earlier form (one key each) with the same writer and reasoning are one item,
    their copies of the text dropped as they are read."""
    # each: its keys, provider, profile, data, scope, and whether it is of the earlier form
    entries: list[tuple[list[str], str, str, Any, str, bool]] = []
    for obj in jsonl.read_objects(path):
        try:
            provider, profile, data = obj["provider"], obj["profile"], obj["data"]
            keys = obj["keys"] if "keys" in obj else [obj["key"]]
        except KeyError:
            continue  # not a line this store wrote
        # a line from before items had a scope: everyone on the task's
        scope = obj.get("scope", TASK_SCOPE)
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            continue
        if not isinstance(scope, str):
            continue
        old_form = "keys" not in obj
        if old_form and entries:
            last_keys, last_provider, last_profile, last_data, _, last_old = entries[-1]
            same = last_old and (last_provider, last_profile) == (provider, profile)
            if same and last_data == data:
                last_keys.extend(keys)
                continue
        entries.append((list(keys), provider, profile, data, scope, old_form))
    return [ReasoningItem(kind, tuple(k), p, q, d, c) for k, p, q, d, c, _ in entries]


def _line(item: ReasoningItem) -> bytes:
    """The item's line in its file."""
    record = {"keys": item.keys, "provider": item.provider, "profile": item.profile}
    return orjson.dumps({**record, "scope": item.scope, "data": item.data}) + b"\n"


# a task's items by their scope, kind and key
Items = dict[tuple[str, str, str], ReasoningItem]
# the reasoning kept in memory over all tasks, counted as the bytes of its items' lines
MAX_BYTES_IN_MEMORY = 256 * 1024 * 1024


class ReasoningStore:
    """Every task's reasoning, loaded from its folder on first use.

    A loaded task stays in memory while it is used: at most ``max_tasks`` of them and
    ``max_bytes`` of their lines, none idle for longer than ``idle_s``. A task forgotten
    is read from its folder again on its next call, once the lines still queued for it
    are written, so it finds every item.
    """

    def __init__(
        self,
        data_dir: Path,
        files: Mapping[str, str],
        max_tasks: int = 4096,
        idle_s: float | None = None,
        clock: Clock = time.monotonic,
        max_bytes: int = MAX_BYTES_IN_MEMORY,
    ) -> None:
        """``files``: each kind of reasoning's file in a task folder (the providers name them)."""
        self.tasks_dir = data_dir / "tasks"
        self._files = dict(files)
        self._items: IdleLru[str, Items] = IdleLru(max_tasks, idle_s, clock, max_bytes)
        self._loading: dict[str, asyncio.Lock] = {}
        self._appender: _Appender | None = None
        # a load (on a worker thread) may be the first to need the thread, as may the loop
        self._appender_lock = threading.Lock()

    @property
    def tasks_in_memory(self) -> int:
        return len(self._items)

    def _path(self, task: str, kind: str) -> Path:
        return self.tasks_dir / folder_name(task) / self._files[kind]

    async def task(self, task: str, scope: str = TASK_SCOPE) -> TaskReasoning:
        """The task's reasoning as the callers of ``scope`` find it, read from disk (off the
        event loop) the first time."""
        items = self._items.get(task)
        if items is None:
            lock = self._loading.setdefault(task, asyncio.Lock())
            async with lock:
                items = self._items.get(task)
                if items is None:
                    loaded, size = await asyncio.to_thread(self._load, task)
                    self._items.put(task, loaded, size)
                    items = loaded
                    # those waiting hold the lock itself; later calls find the items
                    self._loading.pop(task, None)
        return TaskReasoning(self, task, items, scope)

    def _load(self, task: str) -> tuple[Items, int]:
        """The task's items and the bytes of the lines they would be: a file of the earlier
        form holds many copies of one text, of which memory holds one."""
        # lines of a task forgotten while they were queued, and the folders of the earlier
        # naming renamed (the thread's first job): on disk before it is read
        self._running_appender().run(lambda: None).result()
        items: Items = {}
        for kind in self._files:
            for item in _read_items(self._path(task, kind), kind):
                for key in item.keys:
                    items[(item.scope, kind, key)] = item
        held = {id(item): item for item in items.values()}  # each found under a key
        return items, sum(len(_line(item)) for item in held.values())

    def get(self, task: str, kind: str, key: str, scope: str = TASK_SCOPE) -> ReasoningItem | None:
        items = self._items.peek(task)
        return None if items is None else items.get((scope, kind, key))

    def put(self, task: str, item: ReasoningItem, items: Items | None = None) -> None:
        """Keep an item in memory at once, under each of its keys; its one line reaches the
        file in the background.

        ``items``: the task's items as a call holds them, which may be a task forgotten
        since (the file, which the next load reads, gets the line all the same).
        """
        loaded = self._items.peek(task)
        if loaded is None and items is None:
            loaded = {}
            self._items.put(task, loaded)
        for held in (loaded, items):
            if held is not None:
                for key in item.keys:
                    held[(item.scope, item.kind, key)] = item
        # encoded once, however many keys: one pass over the text on the event loop
        line = _line(item)
        if loaded is not None:
            self._items.grow(task, len(line))
        self._running_appender().append(self._path(task, item.kind), line)

    @property
    def where(self) -> str:
        """Where the tasks' state is, for messages."""
        return str(self.tasks_dir)

    async def aclose(self) -> None:
        """``close``, off the event loop."""
        await asyncio.to_thread(self.close)

    async def remove_folders_idle_since(self, cutoff: float) -> list[str]:
        """Remove the task folders nothing was written to since ``cutoff`` (a ``time.time()``),
        and forget those tasks; the tasks removed. Runs on the appender's thread, so no
        line is being appended to a folder as it goes."""
        job = self._running_appender().run(partial(remove_idle_folders, self.tasks_dir, cutoff))
        removed = await asyncio.wrap_future(job)
        for task in removed:
            self._items.pop(task)
        return removed

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until the lines queued so far are in their files (a reader of the files
        from outside the process: tests, a backup)."""
        self._running_appender().run(lambda: None).result(timeout_s)

    def _running_appender(self) -> _Appender:
        with self._appender_lock:
            if self._appender is None:
                self._appender = _Appender(partial(rename_earlier_folders, self.tasks_dir))
            return self._appender

    def close(self) -> None:
        """Write every line still queued."""
        with self._appender_lock:
            appender, self._appender = self._appender, None
        if appender is not None:
            appender.close()


def remove_idle_folders(tasks_dir: Path, cutoff: float) -> list[str]:
    """Remove each folder under ``tasks_dir`` whose newest file was last modified before
    ``cutoff``; the tasks removed. Blocking: never on the event loop."""
    removed: list[str] = []
    try:
        folders = [p for p in tasks_dir.iterdir() if p.is_dir() and not p.is_symlink()]
    except FileNotFoundError:
        return removed
    for folder in folders:
        try:
            newest = max(
                (f.stat().st_mtime for f in folder.iterdir()), default=folder.stat().st_mtime
            )
        except OSError:
            continue
        if newest >= cutoff:
            continue
        try:
            shutil.rmtree(folder)
        except OSError:
            log.exception("cannot remove the idle task folder %s", folder)
            continue
        removed.append(task_of(folder.name))
    return removed


class TaskReasoning:
    """One task's view of the store, for one call of one scope: the task's items as the
    call found them, kept whatever the store forgets meanwhile."""

    __slots__ = ("_items", "_store", "scope", "task")

    def __init__(
        self,
        store: ReasoningStore,
        task: str,
        items: Items | None = None,
        scope: str = TASK_SCOPE,
    ) -> None:
        self._store = store
        self.task = task
        self._items = items
        self.scope = scope

    def find(self, kind: str, keys: Sequence[str]) -> ReasoningItem | None:
        """The item of this scope stored under any of the keys."""
        for key in keys:
            if self._items is not None:
                item = self._items.get((self.scope, kind, key))
            else:
                item = self._store.get(self.task, kind, key, self.scope)
            if item is not None:
                return item
        return None

    def keep(self, kind: str, keys: Sequence[str], provider: str, profile: str, data: Any) -> None:
        """Store one turn's reasoning once, found under each of its keys."""
        unique = tuple(dict.fromkeys(keys))
        if unique:
            item = ReasoningItem(kind, unique, provider, profile, data, self.scope)
            self._store.put(self.task, item, self._items)

    async def saved(self) -> None:
        """At once: only this process reads the task's files, and it holds the items in
        memory until their lines are written (``ReasoningStore.task`` waits for them)."""
