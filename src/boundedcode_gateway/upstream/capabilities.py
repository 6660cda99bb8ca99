"""What a model profile supports, and where the gateway learned it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

CapabilitySource = Literal["props", "assumed", "documentation"]
# where a system message after the start of the conversation reaches the model: as a
# system message in place; folded into a user turn (a template that takes one only at
# the start: policy/mid_system.py); joined into the leading system instruction (an API
# with one system field)
SystemMessages = Literal["in_place", "folded", "joined"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a model profile supports, and where the gateway learned it."""

    streaming: bool
    reasoning_back: bool
    structured_output: bool
    prompt_progress: bool
    source: CapabilitySource
    tools: bool = True
    vision: bool = True
    audio: bool = True
    video: bool = True
    # a media part may name a URL (http...) that the upstream fetches; False: only inline
    # data (a local server would fetch it from this host: docs/security.md#media-from-urls)
    media_urls: bool = True
    context_tokens: int | None = None
    # why earlier reasoning cannot go back (a reasoning model whose template drops it)
    reasoning_back_refusal: str | None = None

    # a stream that breaks in a text answer is continued where it broke, not sent again
    continue_after_break: bool = False
    system_messages: SystemMessages = "in_place"

    def to_json(self) -> dict[str, Any]:
        return {
            "streaming": self.streaming,
            "reasoning_back": self.reasoning_back,
            "structured_output": self.structured_output,
            "prompt_progress": self.prompt_progress,
            "source": self.source,
            "tools": self.tools,
            "vision": self.vision,
            "audio": self.audio,
            "video": self.video,
            "media_urls": self.media_urls,
            "context_tokens": self.context_tokens,
            "reasoning_back_refusal": self.reasoning_back_refusal,
            "continue_after_break": self.continue_after_break,
            "system_messages": self.system_messages,
        }
