"""A request that needs what the model lacks gets a clear 400 before any upstream call,
worded as OpenAI words a field a model does not support; the code stays the
gateway's ``capability_missing``, so the record says why."""

from __future__ import annotations

from typing import Any

from boundedcode_gateway.errors import CapabilityMissing
from boundedcode_gateway.upstream.capabilities import Capabilities


def _has_image(messages: list[Any]) -> bool:
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image_url":
                    return True
    return False


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
    if not caps.vision and _has_image(body["messages"]):
        raise CapabilityMissing(
            "Invalid content type. image_url is only supported by certain models. "
            f"The model '{model}' does not take images (capabilities.vision is false).",
            param="messages",
        )
