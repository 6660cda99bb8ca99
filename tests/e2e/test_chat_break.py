"""The terminal chat client on a real pty when an answer breaks off: what was shown is
erased, and the history it sends next holds the one answer that arrived whole."""

from __future__ import annotations

import sys

from boundedcode_gateway.cli.chat import RESTART_NOTICE
from tests.e2e.conftest import Gateway, Upstreams
from tests.fakes.common import Reply
from tests.integration.test_chat_client import run_on_pty

FIRST = "Caches keep the prefix of the prompt, so the next turn reads only what is new."


def test_a_break_mid_answer_is_erased_and_one_answer_is_kept(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    upstreams.openai.queue(
        Reply(content=FIRST, break_after_chunks=6),  # the role chunk, five tokens
        Reply(content=FIRST),
        Reply(content="Only what is new."),
    )
    screen = run_on_pty(
        [
            sys.executable,
            "-m",
            "boundedcode_gateway",
            "chat",
            "--url",
            gateway.url,
            "--model",
            "gpt",
            "--message",
            "How do caches help?",
            "--message",
            "And the next turn?",
        ],
        timeout_s=60,
    )
    # the five tokens shown, erased back to where they began, the notice, then the answer
    shown, _, rest = screen.partition("\r\x1b[J")
    assert shown.endswith("Caches keep the")
    assert rest.startswith("\r\x1b[K" + RESTART_NOTICE + "\r\x1b[K" + FIRST)
    sent = [r.body for r in upstreams.openai.requests if r.method == "POST"]
    assert len(sent) == 3
    assert sent[2]["messages"] == [
        {"role": "user", "content": "How do caches help?"},
        {"role": "assistant", "content": FIRST},
        {"role": "user", "content": "And the next turn?"},
    ]
    first_call = gateway.calls()[0]
    assert first_call["retried"] is True and first_call["status"] == "ok"
