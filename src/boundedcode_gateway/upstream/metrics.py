"""What one upstream answer measured and yielded, normalised to OpenAI's terms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from boundedcode_gateway.errors import ResponseTooLarge

# what the gateway keeps of one streamed answer (``inference.upstream_limits``)
DEFAULT_CAPTURED_BYTES = 32 << 20
# what one kept piece costs beyond its characters: the string's header and its list slot
PIECE_COST = 64


class CaptureLimit:
    """What one streamed answer may still have kept (its reasoning, text, tool calls and
    their ids), shared by everything that keeps a piece of it; ``ResponseTooLarge`` past it.

    Each piece is charged its length and ``PIECE_COST``: an answer of a million one-letter
    pieces costs what it holds in memory, not a megabyte.
    """

    __slots__ = ("left", "limit")

    def __init__(self, limit: int = DEFAULT_CAPTURED_BYTES) -> None:
        self.limit = limit
        self.left = limit

    def take(self, piece: str) -> None:
        self.left -= len(piece) + PIECE_COST
        if self.left < 0:
            raise ResponseTooLarge(
                "the upstream's streamed answer holds more than "
                "inference.upstream_limits.max_captured_mib "
                f"({self.limit / (1 << 20):g} MiB) of reasoning, text and tool calls to keep"
            )


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
    # the prompt tokens the provider wrote to its cache (Anthropic's cache_creation_input_tokens)
    cache_write_tokens: int | None = None
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
