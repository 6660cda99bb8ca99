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


def read_calls(
    path: Path, task: str | None = None, last: int | None = None
) -> list[dict[str, Any]]:
    """The logged calls (of ``task`` if given, the newest ``last`` if given), oldest first.

    A missing file reads as no calls; lines that do not parse (a crash mid-write) are skipped.
    """
    if last is not None and last <= 0:
        return []
    rows: deque[dict[str, Any]] = deque(maxlen=last)
    for row in jsonl.read_objects(path):
        if task is None or row.get("task") == task:
            rows.append(row)
    return list(rows)
