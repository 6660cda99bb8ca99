"""Recognising "the prompt is longer than the context" in every provider's words.

One table of wordings, matched after status and error type fail to decide.
"""

from __future__ import annotations

import re

# Each provider words the overflow differently; one entry per wording, each with a test.
CONTEXT_OVERFLOW_PATTERNS: tuple[re.Pattern[str], ...] = (
    # llama.cpp: "request (N tokens) exceeds the available context size (M tokens), ..."
    re.compile(r"exceeds the available context size", re.IGNORECASE),
    # OpenAI, vLLM, DeepSeek, Groq, OpenRouter ("This endpoint's maximum context length is N
    # tokens. However, ..."): "This model's maximum context length is N tokens. ..."
    re.compile(r"maximum context length is \d+ tokens", re.IGNORECASE),
    # Anthropic: "prompt is too long: 208656 tokens > 200000 maximum"
    re.compile(r"prompt is too long", re.IGNORECASE),
    # Anthropic: "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000"
    re.compile(r"exceed context limit", re.IGNORECASE),
    # Gemini: "The input token count (N) exceeds the maximum number of tokens allowed (M)."
    re.compile(r"input token count.*exceeds the maximum", re.IGNORECASE),
    # SGLang: "The input (61709 tokens) is longer than the model's context length (40960 tokens)."
    re.compile(r"is longer than the model's context length", re.IGNORECASE),
    # SGLang: "Input length (160062 tokens) exceeds the maximum allowed length (59862 tokens)."
    re.compile(r"input length \(\d+ tokens\) exceeds the maximum allowed length", re.IGNORECASE),
    # Mistral: "Prompt contains 40000 tokens and 0 draft tokens, too large for model with
    # 32768 maximum context length"
    re.compile(r"too large for model with \d+ maximum context length", re.IGNORECASE),
    # text-generation-inference (Hugging Face, Together): "Input validation error: `inputs`
    # tokens + `max_new_tokens` must be <= 4096. Given: ..." / "`inputs` must have less than"
    re.compile(r"`inputs` (tokens \+ `max_new_tokens` must be <=|must have less than)"),
    # xAI: "This model's maximum prompt length is 131072 but the request contains 140000 tokens."
    re.compile(r"maximum prompt length is \d+", re.IGNORECASE),
)

CONTEXT_OVERFLOW_TYPES = frozenset({"exceed_context_size_error"})
CONTEXT_OVERFLOW_CODES = frozenset({"context_length_exceeded"})


def is_context_overflow(message: str, error_type: str | None, code: object) -> bool:
    """True when an upstream error says the prompt does not fit the model's context."""
    if code in CONTEXT_OVERFLOW_CODES or error_type in CONTEXT_OVERFLOW_TYPES:
        return True
    return any(p.search(message) for p in CONTEXT_OVERFLOW_PATTERNS)
