"""Recognising "the prompt is longer than the context" in every provider's words.

One table of wordings, matched after status and error type fail to decide.
"""

from __future__ import annotations

import re

# Each provider words the overflow differently; one entry per wording, each with a test.
CONTEXT_OVERFLOW_PATTERNS: tuple[re.Pattern[str], ...] = (
    # llama.cpp: "request (N tokens) exceeds the available context size (M tokens), ..."
    re.compile(r"exceeds the available context size", re.IGNORECASE),
    # OpenAI and most OpenAI-compatible services
    re.compile(r"maximum context length is \d+ tokens", re.IGNORECASE),
    # Anthropic: "prompt is too long: 208656 tokens > 200000 maximum"
    re.compile(r"prompt is too long", re.IGNORECASE),
    # Gemini: "The input token count (N) exceeds the maximum number of tokens allowed (M)."
    re.compile(r"input token count.*exceeds the maximum", re.IGNORECASE),
)

CONTEXT_OVERFLOW_TYPES = frozenset({"exceed_context_size_error"})
CONTEXT_OVERFLOW_CODES = frozenset({"context_length_exceeded"})


def is_context_overflow(message: str, error_type: str | None, code: object) -> bool:
    """True when an upstream error says the prompt does not fit the model's context."""
    if code in CONTEXT_OVERFLOW_CODES or error_type in CONTEXT_OVERFLOW_TYPES:
        return True
    return any(p.search(message) for p in CONTEXT_OVERFLOW_PATTERNS)
