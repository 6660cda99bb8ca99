"""A request that needs what the model lacks gets a clear 400 before any upstream call,
worded as OpenAI words a field a model does not support; the code stays the
gateway's ``capability_missing``, so the record says why. A media part that names a URL
a local server would fetch is refused the same way (``remote_media_refused``)."""

from __future__ import annotations

from typing import Any

from boundedcode_gateway.errors import CapabilityMissing, RemoteMediaRefused
from boundedcode_gateway.policy.media import MediaKind, MediaPart, media_parts
from boundedcode_gateway.text import clip
from boundedcode_gateway.upstream.capabilities import Capabilities

# how long a URL a refusal repeats may be
_URL_CHARS = 200
# a media type of each kind, for the example in a refusal
_EXAMPLE_TYPES: dict[MediaKind, str] = {
    "image": "image/png",
    "audio": "audio/wav",
    "video": "video/mp4",
    "file": "application/pdf",
}
# what each kind of media is called in a refusal
_NOUNS: dict[MediaKind, str] = {
    "image": "images",
    "audio": "audio",
    "video": "video",
    "file": "files",
}


def _taken(kind: MediaKind, caps: Capabilities) -> bool:
    """Whether the model takes this kind of media (files: the upstream's to judge)."""
    if kind == "image":
        return caps.vision
    if kind == "audio":
        return caps.audio
    if kind == "video":
        return caps.video
    return True


def _not_taken(part: MediaPart, model: str) -> CapabilityMissing:
    noun = _NOUNS[part.kind]
    flag = "vision" if part.kind == "image" else part.kind
    return CapabilityMissing(
        f"Invalid content type. {part.part_type} is only supported by certain models. "
        f"The model '{model}' does not take {noun} (capabilities.{flag} is false).",
        param=part.where,
    )


def _fetched(part: MediaPart, field: str, url: str, model: str) -> RemoteMediaRefused:
    noun = _NOUNS[part.kind]
    path = f"{part.where}.{part.part_type}" + (f".{field}" if field else "")
    return RemoteMediaRefused(
        f"Invalid '{path}': expected a base64-encoded data URL (e.g. "
        f"'data:{_EXAMPLE_TYPES[part.kind]};base64,...') or base64, but got a URL that the "
        f"server of the model '{model}' would fetch: '{clip(url, _URL_CHARS)}'. This "
        f"gateway takes {noun} inline only for this model, so that its server fetches "
        "nothing from the gateway's host (the profile's remote_media is refuse).",
        param=path,
        kind=part.kind,
        url=clip(url, _URL_CHARS),
        model=model,
    )


def check_media(body: dict[str, Any], caps: Capabilities, model: str) -> None:
    """Raise ``CapabilityMissing`` for a kind of media the model does not take, and
    ``RemoteMediaRefused`` for a part whose source is a URL where the model's upstream
    may not be sent one (``capabilities.media_urls`` false)."""
    for part in media_parts(body["messages"]):
        if not _taken(part.kind, caps):
            raise _not_taken(part, model)
        if caps.media_urls:
            continue
        remote = part.remote_source()
        if remote is not None:
            raise _fetched(part, *remote, model)


def check_request(body: dict[str, Any], caps: Capabilities, model: str) -> None:
    """Raise ``CapabilityMissing`` naming the field the model cannot serve."""
    if body.get("return_progress") and not caps.prompt_progress:
        raise CapabilityMissing(
            "Unsupported parameter: 'return_progress' is not supported with this model. "
            f"The model '{model}' does not report prompt progress "
            "(capabilities.prompt_progress is false): drop return_progress.",
            param="return_progress",
        )
    if body.get("stream") and not caps.streaming:
        raise CapabilityMissing(
            "Unsupported value: 'stream' does not support true with this model. "
            f"The model '{model}' does not stream.",
            param="stream",
        )
    if body.get("tools") and not caps.tools:
        raise CapabilityMissing(
            "Unsupported parameter: 'tools' is not supported with this model. "
            f"The model '{model}' has a chat template without tool support.",
            param="tools",
        )
    check_media(body, caps, model)
