"""The call log: ``calls.jsonl``, one JSON object per call, appended and never rewritten.

Owns the line format and reading it back; it must not be written from more than
one thread (the meter writer is its only writer) and must not hold the file open.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from boundedcode_gateway.metering.records import CallRecord


def append_lines(path: Path, records: Sequence[CallRecord]) -> None:
    """Append one JSON line per record in a single write, then flush."""
    if not records:
        return
    # orjson serialises the dataclass itself, in field order, as to_dict() would read
    data = b"".join(orjson.dumps(r) + b"\n" for r in records)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as f:
        # A crash can leave a last line without its newline; start on a fresh line
        # so that the first new record is not glued to the broken one.
        if f.seek(0, 2) > 0:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)
        f.flush()


def read_calls(
    path: Path, task: str | None = None, last: int | None = None
) -> list[dict[str, Any]]:
    """The logged calls (of ``task`` if given, the newest ``last`` if given), oldest first.

    A missing file reads as no calls; lines that do not parse (a crash mid-write) are skipped.
    """
    if last is not None and last <= 0:
        return []
    rows: deque[dict[str, Any]] = deque(maxlen=last)
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return []
    with f:
        for line in f:
            row = _parse(line)
            if row is not None and (task is None or row.get("task") == task):
                rows.append(row)
    return list(rows)


def _parse(line: bytes) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
