"""Files and folders the gateway writes, made its own user's alone whatever the umask.

The data folder holds what callers sent and what answered them (the call log, the
ledger, the stored reasoning, the managed servers' logs) and the key that seals what
callers give back. Every folder the gateway makes there is 0700 and every file 0600,
made so here, in one place: ``os.open`` and ``os.mkdir`` with the mode, then set
exactly, since a umask can only take bits away and one that takes the owner's would
leave a file the gateway cannot write. A file the gateway appends to that is already
open to others (written by an earlier version, or by hand) is made 0600 as it is
opened, with a warning; one it cannot change (another user's) is refused.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

FOLDER_MODE = 0o700
FILE_MODE = 0o600
# the group's and others' bits: any of them set and the file is not the owner's alone
OTHERS_BITS = 0o077


def mode_of(st: os.stat_result) -> int:
    """The permission bits of a ``stat`` result."""
    return stat.S_IMODE(st.st_mode)


def open_to_others(st: os.stat_result) -> bool:
    """Whether anyone but the owner may read, write or enter it."""
    return bool(mode_of(st) & OTHERS_BITS)


def make_folder(path: Path) -> None:
    """``path`` and each folder missing above it made 0700; an existing one is left as it
    is (``private_data_folder`` tightens the data folder itself)."""
    try:
        os.mkdir(path, FOLDER_MODE)
    except FileExistsError:
        if not path.is_dir():
            raise
        return
    except FileNotFoundError:
        if path.parent == path:
            raise
        make_folder(path.parent)
        make_folder(path)
        return
    os.chmod(path, FOLDER_MODE)


def private_data_folder(path: Path) -> None:
    """The data folder made 0700, or an existing one open to others made so, with a
    warning; one that cannot be changed (another user's) is warned of and used as it is,
    since every file the gateway makes in it is 0600 all the same."""
    make_folder(path)
    st = path.stat()
    if not open_to_others(st):
        return
    try:
        os.chmod(path, FOLDER_MODE)
    except PermissionError:
        log.warning(
            "the data folder %s is open to others (mode %04o) and is not this user's to "
            "change: run `chmod 700 %s` as its owner",
            path,
            mode_of(st),
            path,
        )
        return
    log.warning(
        "the data folder %s was open to others (mode %04o); it is now 0700", path, mode_of(st)
    )


def open_append(path: Path, *, readable: bool = False) -> BinaryIO:
    """``path`` opened to append to (and to read, with ``readable``), made 0600 if it is
    not yet there; an existing file open to others is made 0600 first."""
    access = os.O_RDWR if readable else os.O_WRONLY
    fd = os.open(path, access | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        _owner_only(fd, path)
        return os.fdopen(fd, "a+b" if readable else "ab")
    except BaseException:
        os.close(fd)
        raise


def create_new(path: Path) -> BinaryIO:
    """A file that must not exist yet (``FileExistsError`` if it does), made 0600, to write."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


def write_atomically(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` whole (0600), replacing what it held: written beside it,
    then renamed over it, so a reader never sees half of either."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    with create_new(partial) as f:
        f.write(data)
    os.replace(partial, path)


def tighten(path: Path) -> None:
    """An existing file made 0600 if it is open to others (with a warning); a missing one
    is left missing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        _owner_only(fd, path)
    finally:
        os.close(fd)


def _owner_only(fd: int, path: Path) -> None:
    """The open file made 0600: a new one the umask left short of it silently, one open to
    others with a warning; another user's file open to others is refused."""
    st = os.fstat(fd)
    if mode_of(st) == FILE_MODE:
        return
    try:
        os.fchmod(fd, FILE_MODE)
    except PermissionError:
        if not open_to_others(st):
            return  # not 0600, but nobody else's to read (the owner's own choice)
        raise PermissionError(
            f"{path} is open to others (mode {mode_of(st):04o}) and is not this user's to "
            f"change: run `chmod 600 {path}` as its owner, or remove it"
        ) from None
    if open_to_others(st):
        log.warning("%s was open to others (mode %04o); it is now 0600", path, mode_of(st))
