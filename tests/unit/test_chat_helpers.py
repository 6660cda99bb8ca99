"""The chat client's progress line, as docs/llama-server.md words it."""

from __future__ import annotations

import io
from typing import Any

from boundedcode_gateway.cli.chat import (
    CLEAR_LINE,
    ERASE_BELOW,
    RESTART_NOTICE,
    erase_sequence,
    format_tokens,
    progress_line,
    show_answer,
)


def test_format_tokens() -> None:
    assert [format_tokens(n) for n in (0, 950, 1000, 3140, 12449)] == [
        "0",
        "950",
        "1.0k",
        "3.1k",
        "12.4k",
    ]


def test_progress_line_counts_new_tokens_only() -> None:
    line = progress_line({"total": 9000, "cache": 1200, "processed": 4300, "time_ms": 10})
    assert line == "reading the conversation: 3.1k of 7.8k new tokens"


def test_answer_replaces_the_progress_line() -> None:
    out = io.StringIO()
    chunks: list[dict[str, Any]] = [
        {
            "choices": [{"delta": {"role": "assistant"}}],
            "prompt_progress": {"total": 3000, "cache": 0, "processed": 0, "time_ms": 0},
        },
        {
            "choices": [{"delta": {"role": "assistant"}}],
            "prompt_progress": {"total": 3000, "cache": 0, "processed": 3000, "time_ms": 900},
        },
        {"choices": [{"delta": {"reasoning_content": "hmm "}}]},
        {"choices": [{"delta": {"content": "Hello"}}]},
        {"choices": [], "usage": {"prompt_tokens": 3000}},
    ]
    message = show_answer(iter(chunks), out)
    assert message == {"role": "assistant", "content": "Hello", "reasoning_content": "hmm "}
    screen = out.getvalue()
    assert screen == (
        CLEAR_LINE
        + "reading the conversation: 0 of 3.0k new tokens"
        + CLEAR_LINE
        + "reading the conversation: 3.0k of 3.0k new tokens"
        + CLEAR_LINE
        + "hmm Hello\n"
    )


def test_erase_goes_back_over_every_row_the_text_took() -> None:
    assert erase_sequence("one line", 80) == "\r" + ERASE_BELOW
    # 170 characters on an 80-column terminal take three rows
    assert erase_sequence("x" * 170, 80) == "\r\x1b[2A" + ERASE_BELOW
    # a full row leaves the cursor on that row until the next character
    assert erase_sequence("x" * 80, 80) == "\r" + ERASE_BELOW
    assert erase_sequence("first\nsecond\n", 80) == "\r\x1b[2A" + ERASE_BELOW


def test_a_discard_erases_the_answer_and_keeps_only_what_follows() -> None:
    out = io.StringIO()
    chunks: list[dict[str, Any]] = [
        {"choices": [{"delta": {"reasoning_content": "hmm "}}]},
        {"choices": [{"delta": {"content": "Half an"}}]},
        {"choices": [], "boundedcode": {"event": "discard", "reason": "broke"}},
        {"choices": [{"delta": {"content": "Whole answer."}}]},
    ]
    message = show_answer(iter(chunks), out, columns=80)
    assert message == {"role": "assistant", "content": "Whole answer."}
    assert out.getvalue() == (
        "hmm Half an"
        + "\r"
        + ERASE_BELOW
        + CLEAR_LINE
        + RESTART_NOTICE
        + CLEAR_LINE
        + "Whole answer.\n"
    )
