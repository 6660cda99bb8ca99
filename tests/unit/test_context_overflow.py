"""One test per provider wording of "the prompt does not fit"."""

from __future__ import annotations

import pytest

from boundedcode_gateway.policy.context_overflow import is_context_overflow


@pytest.mark.parametrize(
    "message",
    [
        "request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it",
        "This model's maximum context length is 8192 tokens. However, your messages resulted in "
        "9000 tokens. Please reduce the length of the messages.",
        "prompt is too long: 208656 tokens > 200000 maximum",
        "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, "
        "decrease input length or `max_tokens` and try again",
        "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
        "This model's maximum context length is 16384 tokens. However, you requested 122946 "
        "tokens (112946 in the messages, 10000 in the completion). Please reduce the length of "
        "the messages or completion.",
        "This endpoint's maximum context length is 128000 tokens. However, you requested about "
        "131000 tokens (130000 of text input, 1000 in the output).",
        "The input (61709 tokens) is longer than the model's context length (40960 tokens).",
        "Input length (160062 tokens) exceeds the maximum allowed length (59862 tokens).",
        "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 "
        "maximum context length",
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. "
        "Given: 4000 `inputs` tokens and 500 `max_new_tokens`",
        "Input validation error: `inputs` must have less than 4096 tokens. Given: 5000",
        "This model's maximum prompt length is 131072 but the request contains 140000 tokens.",
    ],
)
def test_each_wording_is_recognised(message: str) -> None:
    assert is_context_overflow(message, None, None)


def test_type_and_code_are_enough() -> None:
    assert is_context_overflow("x", "exceed_context_size_error", 400)
    assert is_context_overflow("x", "invalid_request_error", "context_length_exceeded")


@pytest.mark.parametrize(
    "message",
    ["Failed to parse tool call arguments as JSON: bad", "Rate limit reached for gpt-5.1", ""],
)
def test_other_errors_are_not_overflow(message: str) -> None:
    assert not is_context_overflow(message, "server_error", None)
