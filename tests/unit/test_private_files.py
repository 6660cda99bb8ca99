"""The data folder's files are the gateway user's alone: every folder it makes 0700 and every
file 0600 whatever the umask, files open to others tightened as they are appended to, and a
seal key open to others refused."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from boundedcode_gateway import jsonl, private_files
from boundedcode_gateway.errors import ConfigError
from boundedcode_gateway.fronts.sealing import KEY_FILE, Sealer
from boundedcode_gateway.metering.calllog import append_lines
from boundedcode_gateway.metering.ledger import Ledger
from boundedcode_gateway.providers.registry import REASONING_FILES
from boundedcode_gateway.reasoning_store.store import ReasoningStore
from tests.unit.test_metering import make_record

# the usual umask, none at all, the owner-only one, and one that takes the owner's write
UMASKS = [0o022, 0o000, 0o077, 0o277]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def modes_under(root: Path) -> dict[str, int]:
    """Each path under ``root`` (``root`` itself as ``.``) and its permission bits."""
    found = {".": mode(root)}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            found[str(path.relative_to(root))] = mode(path)
    return found


def assert_private(root: Path) -> None:
    """Every folder under ``root`` 0700, every file 0600."""
    wrong = {
        name: f"{m:04o}"
        for name, m in modes_under(root).items()
        if m != (0o700 if (root / name).is_dir() else 0o600)
    }
    assert not wrong, wrong


@pytest.fixture(params=UMASKS, ids=lambda m: f"umask{m:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def test_appended_files_and_their_folders_are_the_owners_alone(tmp_path: Path, umask: int) -> None:
    data = tmp_path / "data"
    append_lines(data / "calls.jsonl", [make_record(0)])
    jsonl.append(data / "tasks" / "t" / "deeper" / "local-replay.jsonl", b"{}\n")
    jsonl.append(data / "tasks" / "t" / "deeper" / "local-replay.jsonl", b"{}\n")
    assert_private(data)
    assert len(modes_under(data)) == 6


async def test_the_reasoning_store_writes_owner_only_folders_and_files(
    tmp_path: Path, umask: int
) -> None:
    store = ReasoningStore(tmp_path / "data", REASONING_FILES)
    task = await store.task("Build")
    task.keep("reasoning_content", ["text:a"], "local", "qwen", "because")
    await store.aclose()
    assert (tmp_path / "data" / "tasks").is_dir()
    assert_private(tmp_path / "data")


def test_the_ledger_and_its_wal_are_the_owners_alone(tmp_path: Path, umask: int) -> None:
    ledger = Ledger(tmp_path / "data" / "ledger.db")
    ledger.open()
    try:
        assert ledger.insert([make_record(1)]) == []
        # SQLite's own files, as they are while it writes
        assert {p.name for p in (tmp_path / "data").iterdir()} >= {
            "ledger.db",
            "ledger.db-wal",
            "ledger.db-shm",
        }
        assert_private(tmp_path / "data")
    finally:
        ledger.close()
    assert_private(tmp_path / "data")


def test_an_earlier_ledgers_files_open_to_others_are_tightened(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = Ledger(path)
    ledger.open()
    ledger.close()
    stale = tmp_path / "ledger.db-journal"
    stale.write_bytes(b"")
    for p in (path, stale):
        p.chmod(0o644)
    again = Ledger(path)
    again.open()
    again.close()
    assert mode(path) == mode(stale) == 0o600


def test_a_file_open_to_others_is_tightened_when_appended_to(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_bytes(b'{"n": 1}\n')
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, "boundedcode_gateway.private_files"):
        jsonl.append(path, b'{"n": 2}\n')
    assert mode(path) == 0o600
    assert [r["n"] for r in jsonl.read_objects(path)] == [1, 2]
    assert f"{path} was open to others (mode 0644); it is now 0600" in caplog.text


def test_the_data_folder_open_to_others_is_tightened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    with caplog.at_level(logging.WARNING, "boundedcode_gateway.private_files"):
        private_files.private_data_folder(data)
    assert mode(data) == 0o700
    assert "was open to others (mode 0755); it is now 0700" in caplog.text
    private_files.private_data_folder(tmp_path / "new" / "data")
    assert mode(tmp_path / "new") == mode(tmp_path / "new" / "data") == 0o700


def test_the_seal_key_is_made_for_its_owner_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    Sealer.in_folder(tmp_path / "data")
    assert_private(tmp_path / "data")


@pytest.mark.parametrize("loose", [0o644, 0o640, 0o604, 0o660, 0o602])
def test_a_seal_key_open_to_others_is_refused_and_left_as_it_is(tmp_path: Path, loose: int) -> None:
    first = Sealer.in_folder(tmp_path)
    key = tmp_path / KEY_FILE
    held = key.read_bytes()
    key.chmod(loose)
    with pytest.raises(ConfigError) as refused:
        Sealer.in_folder(tmp_path)
    message = str(refused.value)
    assert f"the seal key {key} is open to others (mode {loose:04o})" in message
    assert f"chmod 600 {key}" in message
    assert mode(key) == loose and key.read_bytes() == held
    key.chmod(0o400)  # the owner's alone, read-only: used
    assert Sealer.in_folder(tmp_path).verify("text", first.sign("text"))
