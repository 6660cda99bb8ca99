"""The media parts of a chat body: what each carries (an image, audio, video, a file) and
where its bytes come from, inline or from a URL the upstream would fetch (pure).

The part types are the chat shape's (``image_url``, ``input_audio``, ``file``) and
those llama-server and other local servers take besides (``input_video`` and
``video_url``, ``audio_url``). llama-server reads a part's source as it comes: one
that begins with ``http`` it downloads, ``file://`` it reads under ``--media-path``,
``data:`` and bare base64 it decodes (tools/server/server-common.cpp,
``handle_media``). Only the last two keep the request on the machine.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

MediaKind = Literal["image", "audio", "video", "file"]

# part type → (what it carries, the keys of its object that may hold its source)
_PARTS: dict[str, tuple[MediaKind, tuple[str, ...]]] = {
    "image_url": ("image", ("url",)),
    "input_audio": ("audio", ("data", "url")),
    "audio_url": ("audio", ("url",)),
    "input_video": ("video", ("data", "url")),
    "video_url": ("video", ("url", "data")),
    "file": ("file", ("file_data", "file_url", "url")),
}
# bare base64 (OpenAI's ``input_audio.data``), line breaks allowed
_BASE64 = re.compile(r"[A-Za-z0-9+/=\r\n]*")


@dataclass(frozen=True, slots=True)
class MediaPart:
    """One media part: what it carries, its part type, and where it is in the body."""

    kind: MediaKind
    part_type: str
    # the chat path of the part, e.g. messages[2].content[1]
    where: str
    # each string the upstream may read the part's bytes from
    sources: tuple[tuple[str, str], ...]  # (the field's path under the part, its value)

    def remote_source(self) -> tuple[str, str] | None:
        """The first source that is not inline data, and its field; None when all are."""
        for field, value in self.sources:
            if not is_inline(value):
                return field, value
        return None


def is_inline(source: str) -> bool:
    """Whether a part's source is its bytes (a ``data:`` URL, or bare base64) rather than
    a place to fetch them from. A string that starts with ``http`` in any case is a
    place even when its letters could be base64: llama-server tests that prefix first."""
    if source[:5].lower() == "data:":
        return True
    if source[:4].lower() == "http":
        return False
    return _BASE64.fullmatch(source) is not None


def media_parts(messages: list[Any]) -> Iterator[MediaPart]:
    """Every media part of every message's content list, in order."""
    for i, msg in enumerate(messages):
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                continue
            part_type = part.get("type")
            if not isinstance(part_type, str) or part_type not in _PARTS:
                continue
            kind, keys = _PARTS[part_type]
            where = f"messages[{i}].content[{j}]"
            yield MediaPart(kind, part_type, where, tuple(_sources(part.get(part_type), keys)))


def _sources(value: Any, keys: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """The strings under a part's object that may name its bytes (a bare string in the
    object's place too, as some servers read it)."""
    if isinstance(value, str):
        yield "", value
    elif isinstance(value, dict):
        for key in keys:
            source = value.get(key)
            if isinstance(source, str):
                yield key, source
