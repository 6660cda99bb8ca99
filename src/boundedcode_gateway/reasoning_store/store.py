"""The host-side reasoning store: one interface for every provider's reasoning.

Items carry task, provider and model profile (reasoning is data with
provenance). Each task's items live in its folder, one append-only JSONL file
per kind, named by the provider that writes the kind (``tasks/<task>/local-replay.jsonl``
for llama.cpp's reasoning text),
so a resumed run and a restarted gateway keep them. A partial last line from a
crash is skipped. Appends go through one background thread, so lines of
concurrent calls never interleave and the request path never waits on disk.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from boundedcode_gateway import jsonl

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReasoningItem:
    """One turn's reasoning, as the provider wrote it, and who wrote it."""

    kind: str
    key: str
    provider: str
    profile: str
    data: Any


class _Appender:
    """The one thread that appends lines to the task files."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Path, bytes] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="reasoning-appender", daemon=True)
        self._thread.start()

    def append(self, path: Path, line: bytes) -> None:
        self._queue.put((path, line))

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            path, line = job
            try:
                jsonl.append(path, line)
            except OSError:
                log.exception("cannot append to %s", path)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)


def _read_items(path: Path, kind: str) -> list[ReasoningItem]:
    items: list[ReasoningItem] = []
    for obj in jsonl.read_objects(path):
        try:
            items.append(
                ReasoningItem(kind, obj["key"], obj["provider"], obj["profile"], obj["data"])
            )
        except KeyError:
            continue  # not a line this store wrote
    return items


class ReasoningStore:
    """Every task's reasoning, loaded from its folder on first use."""

    def __init__(self, data_dir: Path, files: Mapping[str, str]) -> None:
        """``files``: each kind of reasoning's file in a task folder (the providers name them)."""
        self._tasks_dir = data_dir / "tasks"
        self._files = dict(files)
        self._items: dict[str, dict[tuple[str, str], ReasoningItem]] = {}
        self._loading: dict[str, asyncio.Lock] = {}
        self._appender: _Appender | None = None

    def _path(self, task: str, kind: str) -> Path:
        return self._tasks_dir / task / self._files[kind]

    async def task(self, task: str) -> TaskReasoning:
        """The task's reasoning, read from disk (off the event loop) the first time."""
        if task not in self._items:
            lock = self._loading.setdefault(task, asyncio.Lock())
            async with lock:
                if task not in self._items:
                    self._items[task] = await asyncio.to_thread(self._load, task)
        return TaskReasoning(self, task)

    def _load(self, task: str) -> dict[tuple[str, str], ReasoningItem]:
        items: dict[tuple[str, str], ReasoningItem] = {}
        for kind in self._files:
            for item in _read_items(self._path(task, kind), kind):
                items[(kind, item.key)] = item
        return items

    def get(self, task: str, kind: str, key: str) -> ReasoningItem | None:
        return self._items.get(task, {}).get((kind, key))

    def put(self, task: str, item: ReasoningItem) -> None:
        """Keep an item in memory at once; its line reaches the file in the background."""
        self._items.setdefault(task, {})[(item.kind, item.key)] = item
        if self._appender is None:
            self._appender = _Appender()
        line = (
            orjson.dumps(
                {
                    "key": item.key,
                    "provider": item.provider,
                    "profile": item.profile,
                    "data": item.data,
                }
            )
            + b"\n"
        )
        self._appender.append(self._path(task, item.kind), line)

    def close(self) -> None:
        """Write every line still queued."""
        if self._appender is not None:
            self._appender.close()
            self._appender = None


class TaskReasoning:
    """One task's view of the store, for one call."""

    __slots__ = ("_store", "task")

    def __init__(self, store: ReasoningStore, task: str) -> None:
        self._store = store
        self.task = task

    def find(self, kind: str, keys: Sequence[str]) -> ReasoningItem | None:
        """The item stored under any of the keys."""
        for key in keys:
            item = self._store.get(self.task, kind, key)
            if item is not None:
                return item
        return None

    def keep(self, kind: str, keys: Sequence[str], provider: str, profile: str, data: Any) -> None:
        """Store one turn's reasoning under each of its keys."""
        for key in keys:
            self._store.put(self.task, ReasoningItem(kind, key, provider, profile, data))
