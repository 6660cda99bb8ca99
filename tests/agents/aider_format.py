"""The scripted model's answers to aider, in the edit format aider asked for (pure).

aider sends no tools: its system prompt says how an edit must be written, and aider
parses the answer's text into edits (aider/coders/*_coder.py). `edit_format_of` reads which
format a request asks for from the words aider's own prompts use (aider/coders/*_prompts.py,
0.86); `file_creation` writes the task's file in it exactly as that coder parses a new
file:

- `whole`, `editor-whole`: a *file listing*, the file name alone on the line before the
  opening fence (wholefile_coder.py)
- `diff`, `editor-diff`: a *SEARCH/REPLACE block* with an empty SEARCH part, the file name
  on the line before the fence; `diff-fenced`, `editor-diff-fenced`: the name inside the
  fence (editblock_coder.py `find_original_update_blocks`)
- `udiff`, `udiff-simple`: a ```` ```diff ```` block from `--- /dev/null` to `+++ NAME`
  (udiff_coder.py `find_diffs`)
- `patch`: `*** Begin Patch` / `*** Add File: NAME` / `+` lines / `*** End Patch`
  (patch_coder.py); aider 0.86 itself refuses it (it makes the file empty first, then its
  Add finds the file there), so no answer creates a file in this format

`editor-diff-fenced` asks in `diff-fenced`'s words (it only leaves out the shell commands)
and is read as that: the answer is the same block.

aider's flow in a git repository has a second call: the commit message for the edit it
applied, asked for with its own system prompt (aider/prompts.py `commit_system`);
`commit_message` answers it. `aider_text` is the `TextResponder` for both; `register`
puts it in the scripted model's registry.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

from tests.agents.scripted_model import TEXT_RESPONDERS, Task, find_task
from tests.fakes.common import JSON, content_text

__all__ = [
    "EditFormat",
    "aider_text",
    "commit_message",
    "edit_format_of",
    "fence_of",
    "file_creation",
    "register",
]


class EditFormat(Enum):
    """aider's `--edit-format` values whose answers create a file."""

    WHOLE = "whole"
    EDITOR_WHOLE = "editor-whole"
    DIFF = "diff"
    DIFF_FENCED = "diff-fenced"
    EDITOR_DIFF = "editor-diff"
    EDITOR_DIFF_FENCED = "editor-diff-fenced"
    UDIFF = "udiff"
    UDIFF_SIMPLE = "udiff-simple"
    PATCH = "patch"


# how every edit coder's system prompt begins (aider/coders/*_prompts.py `main_system`)
_AIDER = "Act as an expert software developer"
# what each family's prompts say, and nothing else of aider's says
_PATCH = "*** Begin Patch"
_UDIFF = "like `diff -U0` would produce"
_UDIFF_EXAMPLE = "--- mathweb/flask/app.py\n+++ mathweb/flask/app.py"
_BLOCK = "*SEARCH/REPLACE block*"
_LISTING = "*file listing*"
_COMMIT = "one-line Git commit messages"
# the editor coders' own main_system (editor_*_prompts.py): an editor writes edits only
_EDITOR_BLOCK = "Act as an expert software developer who edits source code."
_EDITOR_WHOLE = "Act as an expert software developer and make changes to source code."
# the diff-fenced examples put the file name inside the fence, under its opening line
_FENCED_EXAMPLE = re.compile(r"^\S*python\nmathweb/flask/app\.py\n<<<<<<< SEARCH", re.M)
# the fence aider chose appears in its examples and reminders around a file name
_FENCE_AROUND = (
    re.compile(r"path/to/filename\.js\n(\S+)\n// entire file content"),
    re.compile(r"mathweb/flask/app\.py\n(\S+?)python\n<<<<<<< SEARCH"),
    re.compile(r"^(\S+?)python\nmathweb/flask/app\.py\n<<<<<<< SEARCH", re.M),
)
_CLOSING = {"```": "```", "````": "````"}
_DEFAULT_FENCE = ("```", "```")
_COMMIT_MESSAGE = "feat: Add {name}"


def _system(body: JSON) -> str:
    messages: Any = body.get("messages") or []
    return "\n".join(
        content_text(m.get("content"))
        for m in messages
        if isinstance(m, dict) and m.get("role") == "system"
    )


def _texts(body: JSON) -> str:
    """Every message's text, in order: aider puts its examples and reminders in the system
    message or in the turns before the user's (by model setting)."""
    messages: Any = body.get("messages") or []
    return "\n".join(content_text(m.get("content")) for m in messages if isinstance(m, dict))


def edit_format_of(body: JSON) -> EditFormat | None:
    """The edit format an aider request asks for; None when it asks for no edit."""
    if _AIDER not in _system(body):
        return None
    text = _texts(body)
    if _PATCH in text:
        return EditFormat.PATCH
    if _UDIFF in text:
        return EditFormat.UDIFF if _UDIFF_EXAMPLE in text else EditFormat.UDIFF_SIMPLE
    if _BLOCK in text:
        fenced = _FENCED_EXAMPLE.search(text) is not None
        if _EDITOR_BLOCK in text:
            return EditFormat.EDITOR_DIFF_FENCED if fenced else EditFormat.EDITOR_DIFF
        return EditFormat.DIFF_FENCED if fenced else EditFormat.DIFF
    if _LISTING in text:
        return EditFormat.EDITOR_WHOLE if _EDITOR_WHOLE in text else EditFormat.WHOLE
    return None


def fence_of(body: JSON) -> tuple[str, str]:
    """The fence aider asked for: ``` unless its files made it choose another (base_coder.py
    `choose_fence`: four backticks, or a tag such as <source>...</source>)."""
    text = _texts(body)
    for pattern in _FENCE_AROUND:
        found = pattern.search(text)
        if found:
            opening = found[1]
            if opening in _CLOSING:
                return opening, _CLOSING[opening]
            tag = re.fullmatch(r"<(\w+)>", opening)
            if tag:
                return opening, f"</{tag[1]}>"
    return _DEFAULT_FENCE


def file_creation(fmt: EditFormat, task: Task, fence: tuple[str, str] = _DEFAULT_FENCE) -> str:
    """An answer that creates `task.path` holding `task.text` (one line, so the file aider
    writes is the text and a newline) in the format `fmt`, as aider parses it."""
    name, text = task.path, task.text
    opening, closing = fence
    # editors write edits only (their prompts: "ONLY EVER RETURN CODE"), a patch is the whole
    # answer ("MUST start with `*** Begin Patch`"); the others say what they do first, as
    # aider's examples do
    quiet = fmt.value.startswith("editor-") or fmt is EditFormat.PATCH
    say = "" if quiet else f"I will create {name} with the text.\n\n"
    if fmt in (EditFormat.WHOLE, EditFormat.EDITOR_WHOLE):
        return f"{say}{name}\n{opening}\n{text}\n{closing}\n"
    if fmt in (EditFormat.DIFF, EditFormat.EDITOR_DIFF):
        block = f"<<<<<<< SEARCH\n=======\n{text}\n>>>>>>> REPLACE\n"
        return f"{say}{name}\n{opening}text\n{block}{closing}\n"
    if fmt in (EditFormat.DIFF_FENCED, EditFormat.EDITOR_DIFF_FENCED):
        block = f"<<<<<<< SEARCH\n=======\n{text}\n>>>>>>> REPLACE\n"
        return f"{say}{opening}text\n{name}\n{block}{closing}\n"
    if fmt in (EditFormat.UDIFF, EditFormat.UDIFF_SIMPLE):
        # udiff blocks are always fenced with backticks (udiff_coder.py `find_diffs`)
        return f"{say}```diff\n--- /dev/null\n+++ {name}\n@@ ... @@\n+{text}\n```\n"
    return f"{say}*** Begin Patch\n*** Add File: {name}\n+{text}\n*** End Patch\n"


def commit_message(body: JSON) -> str | None:
    """The one-line message for aider's commit of the edit; None for other requests."""
    if _COMMIT not in _system(body):
        return None
    added = re.search(r"^\+\+\+ (?:b/)?(\S+)", _texts(body), re.M)
    name = added[1].rsplit("/", 1)[-1] if added else "the requested file"
    return _COMMIT_MESSAGE.format(name=name)


def aider_text(body: JSON) -> str | None:
    """The scripted model's answer to an aider request: the edit that does the task, or
    the commit message; None when the request is not aider's."""
    message = commit_message(body)
    if message is not None:
        return message
    fmt = edit_format_of(body)
    if fmt is None:
        return None
    messages: Any = body.get("messages") or []
    found = find_task(list(messages))
    if found is None:
        return None
    return file_creation(fmt, found[0], fence_of(body))


def register() -> None:
    """Put `aider_text` in the scripted model's registry (once)."""
    if aider_text not in TEXT_RESPONDERS:
        TEXT_RESPONDERS.append(aider_text)
