"""What one upstream answer measured and yielded, normalised to OpenAI's terms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class CapturedReasoning:
    """An answer's reasoning as the provider wrote it, with what its turn will be found by."""

    kind: str
    tool_call_ids: list[str]
    text: str
    data: Any


@dataclass(slots=True)
class CallMetrics:
    """What one upstream answer measured, normalised to OpenAI's usage terms."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    evaluated_tokens: int | None = None
    # how much of the prompt the server has read so far (llama.cpp's prompt progress)
    prompt_processed: int | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    finish_reason: str | None = None
    upstream_model: str | None = None
    captured: CapturedReasoning | None = None
    # the answer's text, kept when a schema was sent (to check the reply against it)
    answer_text: str | None = None
    # the whole answer as an assistant message, kept when asked (the cache keeper renders it)
    answer_message: dict[str, Any] | None = None
