"""The call log: ``calls.jsonl``, one JSON object per call, appended and never rewritten.

Owns the line format and reading it back; it must not be written from more than
one thread (the meter writer is its only writer) and must not hold the file open.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from boundedcode_gateway import jsonl
from boundedcode_gateway.metering.records import CallRecord, Rejected


def append_lines(path: Path, records: Sequence[CallRecord]) -> list[Rejected]:
    """Append one JSON line per record in a single write, then flush; the records that
    cannot be written as JSON are left out and returned."""
    if not records:
        return []
    rejected: list[Rejected] = []
    try:
        # orjson serialises the dataclass itself, in field order, as to_dict() would read
        data = b"".join(orjson.dumps(r) + b"\n" for r in records)
    except orjson.JSONEncodeError:
        lines = []
        for record in records:
            try:
                lines.append(orjson.dumps(record) + b"\n")
            except orjson.JSONEncodeError as exc:
                rejected.append((record, exc))
        data = b"".join(lines)
    if data:
        jsonl.append(path, data)
    return rejected


def rotated(path: Path, n: int) -> Path:
    """The ``n``-th rotated call log: ``calls.jsonl.1`` the newest."""
    return path.with_name(f"{path.name}.{n}")


def log_files(path: Path) -> list[Path]:
    """The call log and its rotated files that exist, oldest first."""
    files: list[Path] = []
    n = 1
    while rotated(path, n).is_file():
        files.append(rotated(path, n))
        n += 1
    files.reverse()
    return [*files, path] if path.is_file() or not files else files


def rotate(path: Path, keep: int) -> None:
    """``calls.jsonl`` becomes ``calls.jsonl.1``, ``.1`` becomes ``.2`` and so on; the file
    past ``keep`` rotated ones is deleted. The writer thread's alone, between two appends."""
    rotated(path, keep).unlink(missing_ok=True)
    for n in range(keep - 1, 0, -1):
        if rotated(path, n).is_file():
            rotated(path, n).rename(rotated(path, n + 1))
    if path.is_file():
        path.rename(rotated(path, 1))


def read_calls(
    path: Path, task: str | None = None, last: int | None = None
) -> list[dict[str, Any]]:
    """The logged calls (of ``task`` if given, the newest ``last`` if given), oldest first,
    the rotated files' included.

    A missing file reads as no calls; lines that do not parse (a crash mid-write) are skipped.
    """
    if last is not None and last <= 0:
        return []
    rows: deque[dict[str, Any]] = deque(maxlen=last)
    for file in log_files(path):
        for row in jsonl.read_objects(file):
            if task is None or row.get("task") == task:
                rows.append(row)
    return list(rows)


def read_tail(path: Path, tail_bytes: int) -> Iterator[dict[str, Any]]:
    """The calls within the last ``tail_bytes`` of the log, oldest first: the newest
    rotated file's end too when the log itself is shorter (it was just rotated)."""
    size = path.stat().st_size if path.is_file() else 0
    previous = rotated(path, 1)
    if size < tail_bytes and previous.is_file():
        yield from jsonl.read_objects(previous, tail_bytes=tail_bytes - size)
    yield from jsonl.read_objects(path, tail_bytes=tail_bytes)
