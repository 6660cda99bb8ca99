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
        "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
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
