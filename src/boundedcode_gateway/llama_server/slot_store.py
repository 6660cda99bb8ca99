"""The gateway's slot files: each conversation's saved llama-server slot, on disk.

A llama-server saves a slot (``POST /slots/{i}?action=save``) into its own
``--slot-save-path``; the gateway then moves the file into one store under its data
folder, next to a small description of it (``<name>.json``): whose conversation it
is, the server it fits (``identity``: the model file, the build, the context and the
KV cache's types), how many tokens it holds, how many of them the conversation's next
call is to find cached, its size and its SHA-256. To restore, the file is linked into
the target server's folder, checked first: a file cut short, changed since it was
written, not a slot file at all, or made by a server unlike the target is refused and
named, never restored. The store holds at most ``disk_bytes``; past that the least
recently used conversation's file goes first. Everything here is the gateway user's
alone (0700 folder, 0600 files).

Its blocking work (hashing, moving, linking, removing) runs in a thread; the event
loop only waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import orjson

from boundedcode_gateway import private_files

log = logging.getLogger(__name__)

# the store's folder in the data folder
SLOT_FILES_FOLDER = "slot-files"
SLOT_SUFFIX = ".slot"
ABOUT_SUFFIX = ".json"
# what llama.cpp writes first in a sequence's state file ("ggsq", little-endian)
STATE_MAGIC = b"qsgg"
_HASH_CHUNK = 1 << 20

# why a file was not restored
Refusal = Literal["missing", "mismatched", "cut", "corrupt", "foreign"]
REFUSALS: dict[str, str] = {
    "missing": "the slot file is gone",
    "mismatched": "the slot file was saved by a server with another model, build, context "
    "or KV cache type",
    "cut": "the slot file is not the size it was saved at",
    "corrupt": "the slot file changed since it was saved",
    "foreign": "the file is not a llama-server slot file",
}


@dataclass(frozen=True, slots=True)
class SlotFile:
    """One conversation's saved slot, as its description on disk says."""

    name: str  # the file's name in the store, without suffix: a digest of its owner
    task: str
    identity: str  # the server it fits: docs/llama-server.md, "Slot files"
    tokens: int  # tokens saved
    prefix_tokens: int  # of them, what the conversation's next call is to find cached
    size: int
    sha256: str
    saved_at: float  # wall clock
    used_at: float  # wall clock: saved or restored last (the budget's order)

    def about(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def read(cls, raw: bytes) -> SlotFile:
        data = orjson.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("a slot file's description is an object")
        return cls(
            name=str(data["name"]),
            task=str(data["task"]),
            identity=str(data["identity"]),
            tokens=int(data["tokens"]),
            prefix_tokens=int(data["prefix_tokens"]),
            size=int(data["size"]),
            sha256=str(data["sha256"]),
            saved_at=float(data["saved_at"]),
            used_at=float(data["used_at"]),
        )


@dataclass(frozen=True, slots=True)
class Saving:
    """What a file just saved is: whose (its store name and task), the server it fits,
    its tokens and, of them, what the conversation's next call is to find cached."""

    name: str
    task: str
    identity: str
    tokens: int
    prefix_tokens: int


@dataclass(frozen=True, slots=True)
class StoreTotals:
    files: int
    bytes: int


def slot_file_name(*owner: str) -> str:
    """The store's name for a conversation's file: a digest of who it belongs to, so any
    task id, purpose or caller is a safe file name, and names differing only in case are
    not mixed up on a case-insensitive file system."""
    return hashlib.sha256("\x00".join(owner).encode("utf-8", "surrogatepass")).hexdigest()[:40]


def file_digest(path: Path) -> tuple[int, str, bytes]:
    """A file's size, SHA-256 and first bytes."""
    digest = hashlib.sha256()
    size = 0
    head = b""
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            if not head:
                head = chunk[:8]
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest(), head


class SlotStore:
    """The slot files of one gateway, bounded on disk."""

    def __init__(
        self,
        folder: Path,
        disk_bytes: int,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.folder = folder
        self.disk_bytes = disk_bytes
        self._clock = wall_clock
        self._files: dict[str, SlotFile] = {}
        # held by the thread that changes the folder: a save, a restore's link, a removal
        self._lock = threading.Lock()
        self._loaded = False
        self._loading: asyncio.Lock | None = None

    @property
    def where(self) -> str:
        return f"the slot files in {self.folder}"

    # -- reading the folder

    async def load(self) -> None:
        """Read the descriptions of the files saved before (a restarted gateway's), once;
        a file without one, or a description without its file, is removed."""
        if self._loading is None:
            self._loading = asyncio.Lock()
        async with self._loading:
            if not self._loaded:
                await asyncio.to_thread(self._load)
                self._loaded = True

    def _load(self) -> None:
        private_files.make_folder(self.folder)
        found: dict[str, SlotFile] = {}
        for about in self.folder.glob("*" + ABOUT_SUFFIX):
            try:
                entry = SlotFile.read(about.read_bytes())
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("slot files: %s cannot be read; removed", about.name)
                _unlink(about)
                continue
            if entry.name != about.name.removesuffix(ABOUT_SUFFIX):
                _unlink(about)
                continue
            if not self._slot_path(entry.name).exists():
                _unlink(about)
                continue
            found[entry.name] = entry
        for slot in self.folder.glob("*" + SLOT_SUFFIX):
            if slot.name.removesuffix(SLOT_SUFFIX) not in found:
                _unlink(slot)  # a save cut short before its description was written
        with self._lock:
            self._files = found
            self._within_budget(keep=None)

    # -- what is there

    def get(self, name: str) -> SlotFile | None:
        return self._files.get(name)

    def totals(self) -> StoreTotals:
        files = list(self._files.values())
        return StoreTotals(len(files), sum(f.size for f in files))

    def tasks(self) -> set[str]:
        return {f.task for f in self._files.values()}

    # -- saving

    async def adopt(self, saved: Path, about: Saving) -> SlotFile:
        """Take the file a server just saved (``saved``, in its own folder) into the store
        as ``about.name``'s, replacing the one before; the least recently used files then
        go until the store is within its budget."""
        return await asyncio.to_thread(self._adopt, saved, about)

    def _adopt(self, saved: Path, about: Saving) -> SlotFile:
        name = about.name
        private_files.make_folder(self.folder)
        target = self._slot_path(name)
        with self._lock:
            _move(saved, target)
            target.chmod(0o600)
            size, sha, _head = file_digest(target)
            now = self._clock()
            entry = SlotFile(
                name,
                about.task,
                about.identity,
                about.tokens,
                about.prefix_tokens,
                size,
                sha,
                now,
                now,
            )
            private_files.write_atomically(self._about_path(name), entry.about())
            self._files[name] = entry
            self._within_budget(keep=name)
        return entry

    def _within_budget(self, keep: str | None) -> None:
        """Remove the least recently used files until the rest fit (the lock held)."""
        total = sum(f.size for f in self._files.values())
        if total <= self.disk_bytes:
            return
        for entry in sorted(self._files.values(), key=lambda f: f.used_at):
            if total <= self.disk_bytes:
                break
            if entry.name == keep and entry.size <= self.disk_bytes:
                continue
            self._remove(entry.name)
            total -= entry.size
            log.info("slot files: %s removed to keep within the disk budget", entry.name)

    # -- restoring

    async def check_out(
        self, name: str, identity: str, into: Path
    ) -> tuple[SlotFile, str] | Refusal:
        """Link conversation ``name``'s file into the server folder ``into`` under a
        name of its own, after checking it is whole and fits the server (``identity``);
        the entry and the linked name, or why not. ``check_in`` removes the link."""
        return await asyncio.to_thread(self._check_out, name, identity, into)

    def _check_out(self, name: str, identity: str, into: Path) -> tuple[SlotFile, str] | Refusal:
        entry = self._files.get(name)
        if entry is None:
            return "missing"
        if entry.identity != identity:
            return "mismatched"
        path = self._slot_path(name)
        try:
            size, sha, head = file_digest(path)
        except FileNotFoundError:
            with self._lock:
                self._files.pop(name, None)
            return "missing"
        if not head.startswith(STATE_MAGIC):
            return "foreign"
        if size != entry.size:
            return "cut"
        if sha != entry.sha256:
            return "corrupt"
        linked = f"{name}.restore-{os.getpid()}-{time.monotonic_ns()}{SLOT_SUFFIX}"
        with self._lock:
            _link(path, into / linked)
            used = SlotFile(**{**asdict(entry), "used_at": self._clock()})
            self._files[name] = used
            private_files.write_atomically(self._about_path(name), used.about())
        return used, linked

    async def check_in(self, into: Path, linked: str) -> None:
        """Remove the link ``check_out`` made, once the server read it."""
        await asyncio.to_thread(_unlink, into / linked)

    # -- removing

    async def remove(self, name: str) -> None:
        """Forget a conversation's file (one the server refused, which would be refused
        again)."""
        await asyncio.to_thread(self._remove_locked, name)

    def _remove_locked(self, name: str) -> None:
        with self._lock:
            self._remove(name)

    def _remove(self, name: str) -> None:
        self._files.pop(name, None)
        _unlink(self._about_path(name))
        _unlink(self._slot_path(name))

    async def remove_tasks(self, tasks: Iterable[str]) -> int:
        """Remove the files of ``tasks`` (the task state was removed); how many."""
        wanted = set(tasks)
        return await asyncio.to_thread(self._remove_where, lambda f: f.task in wanted)

    async def remove_idle_tasks(self, cutoff: float) -> list[str]:
        """Remove the files of conversations not saved or restored since ``cutoff`` (wall
        clock), as retention removes a task's other state; the tasks they were of."""
        await self.load()
        gone = [f.task for f in list(self._files.values()) if f.used_at < cutoff]
        await asyncio.to_thread(self._remove_where, lambda f: f.used_at < cutoff)
        return sorted(set(gone))

    def _remove_where(self, doomed: Callable[[SlotFile], bool]) -> int:
        with self._lock:
            names = [f.name for f in self._files.values() if doomed(f)]
            for name in names:
                self._remove(name)
        return len(names)

    def _slot_path(self, name: str) -> Path:
        return self.folder / (name + SLOT_SUFFIX)

    def _about_path(self, name: str) -> Path:
        return self.folder / (name + ABOUT_SUFFIX)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _move(source: Path, target: Path) -> None:
    """``source`` to ``target`` whole, replacing it: a rename, or across file systems a
    copy then a rename."""
    try:
        os.replace(source, target)
    except OSError:
        partial = target.with_suffix(".partial")
        shutil.copyfile(source, partial)
        os.replace(partial, target)
        _unlink(source)


def _link(source: Path, target: Path) -> None:
    """``target`` names ``source``'s bytes: a hard link, or a copy across file systems."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
    os.chmod(target, 0o600)
