"""JSON Lines files: appends on a fresh line after a crash, reads that skip what is broken."""

from __future__ import annotations

from pathlib import Path

from boundedcode_gateway import jsonl


def test_a_line_cut_short_is_skipped_and_not_glued_to(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": 2')
    jsonl.append(path, b'{"n": 3}\n')
    assert [r["n"] for r in jsonl.read_objects(path)] == [1, 3]


def test_the_tail_holds_only_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    lines = [b'{"n": %d, "pad": "%s"}\n' % (n, b"x" * 20) for n in range(100)]
    path.write_bytes(b"".join(lines))
    tail = len(lines[0]) * 3 + 5  # three lines and the end of a fourth
    assert [r["n"] for r in jsonl.read_objects(path, tail_bytes=tail)] == [97, 98, 99]
    # a tail larger than the file reads it all
    assert len(list(jsonl.read_objects(path, tail_bytes=10**9))) == 100
    assert list(jsonl.read_objects(tmp_path / "missing.jsonl", tail_bytes=10)) == []
