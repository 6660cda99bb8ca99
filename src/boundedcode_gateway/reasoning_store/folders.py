"""A task's folder name under ``tasks/``: one per task id, even where the filesystem folds case.

Task ids are ``A-Z a-z 0-9 . _ -`` (ingress/validate.py), and ids that differ only in case
are different tasks; on a filesystem that folds case (macOS's and Windows' by default) a
folder named by the id itself would be shared by ``Build`` and ``build``. So a folder is
named in lower case: an id without upper-case letters is its own name (every such folder
already written keeps its name), and an id with them is its lower-case form, a ``+`` (no
id has one) and, in hexadecimal, the mask of its upper-case letters, the first letter
the lowest bit: ``Build`` → ``build+1``, ``MyTask`` → ``mytask+5``. Names never differ in
case alone, the id is read back from its name (retention names the tasks it removes),
and the longest (128 upper-case letters) is 161 characters.

Folders of the earlier naming (``Build`` under its own name) are renamed once, by the
store's thread before anything else it does (``rename_earlier_folders``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from boundedcode_gateway.call_context import TASK_ID

log = logging.getLogger(__name__)

MASK_SEPARATOR = "+"


def folder_name(task: str) -> str:
    """The folder of ``task`` under ``tasks/``: the same name whatever the case folding."""
    lower = task.lower()
    if lower == task:
        return task
    mask = sum(1 << i for i, c in enumerate(task) if c.isupper())
    return f"{lower}{MASK_SEPARATOR}{mask:x}"


def task_of(name: str) -> str:
    """The task a folder under ``tasks/`` holds: ``folder_name``'s inverse, and a name of the
    earlier naming (or none of the gateway's) as it is."""
    lower, separator, mask_hex = name.rpartition(MASK_SEPARATOR)
    if not separator:
        return name
    try:
        mask = int(mask_hex, 16)
    except ValueError:
        return name
    task = "".join(c.upper() if mask >> i & 1 else c for i, c in enumerate(lower))
    return task if folder_name(task) == name else name


def _of_earlier_naming(name: str) -> bool:
    """A folder an earlier gateway named by the id itself, which has upper-case letters."""
    return TASK_ID.fullmatch(name) is not None and name != name.lower()


def rename_earlier_folders(tasks_dir: Path) -> int:
    """Each task folder of the earlier naming renamed to its task's name now; the number
    renamed. A folder whose new name is taken already is left as it is, with a warning
    (nothing is merged or removed). Blocking: on the store's thread."""
    try:
        entries = [e for e in os.scandir(tasks_dir) if _of_earlier_naming(e.name)]
    except FileNotFoundError:
        return 0
    renamed = 0
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        target = tasks_dir / folder_name(entry.name)
        if os.path.lexists(target):
            log.warning(
                "the task folder %s is of the earlier naming, and %s is there too: %s is left "
                "as it is, its reasoning not read",
                entry.path,
                target,
                entry.path,
            )
            continue
        try:
            os.rename(entry.path, target)
        except OSError:
            log.exception("cannot rename the task folder %s to %s", entry.path, target)
            continue
        renamed += 1
    if renamed:
        log.info("renamed %d task folders of %s to names that keep case apart", renamed, tasks_dir)
    return renamed
