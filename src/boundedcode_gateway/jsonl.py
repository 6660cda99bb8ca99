"""Append-only JSON Lines files: whole lines appended, a line cut short by a crash skipped.

The call log and the reasoning store keep their records this way. A crash can
leave a last line without its newline; the next append starts on a fresh line
so that its first record is not glued to the broken one, and readers skip what
does not parse. Writers run off the request path (these are blocking calls). The
files and their folders are the gateway user's alone (``private_files.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from boundedcode_gateway import private_files


def append(path: Path, data: bytes) -> None:
    """Append ``data`` (whole lines, each ending in a newline) in one write."""
    private_files.make_folder(path.parent)
    with private_files.open_append(path, readable=True) as f:
        if f.seek(0, 2) > 0:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)
        f.flush()


def read_objects(path: Path, tail_bytes: int | None = None) -> Iterator[dict[str, Any]]:
    """Each line that is a JSON object, oldest first; a missing file has none.

    With ``tail_bytes``, only the whole lines within the file's last ``tail_bytes``.
    """
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return
    with f:
        if tail_bytes is not None and f.seek(0, 2) > tail_bytes:
            f.seek(-tail_bytes, 2)
            f.readline()  # most likely the end of a line that began before the tail
        else:
            f.seek(0)
        for line in f:
            if not line.strip():
                continue
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(value, dict):
                yield value
