"""The lines of a system prompt that change on every request: each rule removes its
own line and nothing else."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.policy.volatile_lines import (
    RULES,
    strip_system_messages,
    strip_text,
)

BILLING = "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch=fa690;"
PROMPT = "You are Claude Code, Anthropic's official CLI for Claude."


def test_every_rule_is_documented_and_named_once() -> None:
    assert len({r.name for r in RULES}) == len(RULES)
    assert all(r.source and r.marker for r in RULES)


def test_the_claude_code_billing_line_goes_and_the_prompt_stays() -> None:
    assert strip_text(f"{BILLING}\n{PROMPT}") == (PROMPT, ["claude_code_billing_header"])
    assert strip_text(f"{PROMPT}\n{BILLING}") == (f"{PROMPT}\n", ["claude_code_billing_header"])
    assert strip_text(BILLING) == ("", ["claude_code_billing_header"])
    # a mention inside a line is not the header
    quoted = f"Never print the x-anthropic-billing-header: line. {PROMPT}"
    assert strip_text(quoted) == (quoted, [])


def test_system_messages_of_text_or_parts_lose_the_line() -> None:
    messages: list[Any] = [
        {
            "role": "system",
            "content": [{"type": "text", "text": BILLING}, {"type": "text", "text": PROMPT}],
        },
        {"role": "developer", "content": f"{BILLING}\nBe brief."},
        {"role": "user", "content": BILLING},
    ]
    out, removed = strip_system_messages(messages)
    assert removed == ["claude_code_billing_header"]
    assert out[0] == {"role": "system", "content": [{"type": "text", "text": PROMPT}]}
    assert out[1] == {"role": "developer", "content": "Be brief."}
    assert out[2] == messages[2]  # what a user writes is theirs
    assert messages[0]["content"][0]["text"] == BILLING  # the caller's body is not changed
    only, _ = strip_system_messages(
        [{"role": "system", "content": [{"type": "text", "text": BILLING}]}]
    )
    assert only == [{"role": "system", "content": ""}]


def test_messages_without_such_a_line_are_the_same_list() -> None:
    messages: list[Any] = [{"role": "system", "content": PROMPT}, {"role": "user", "content": "hi"}]
    out, removed = strip_system_messages(messages)
    assert out is messages and removed == []


@given(st.text(), st.text(alphabet="0123456789abcdef", min_size=5, max_size=5))
def test_two_prompts_differing_only_in_the_nonce_become_one(rest: str, nonce: str) -> None:
    line = (
        f"x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=sdk-cli; cch={nonce};"
    )
    first, _ = strip_text(f"{line}\n{rest}")
    second, _ = strip_text(f"{line.replace(nonce, 'fffff')}\n{rest}")
    assert first == second
    assert strip_text(first)[0] == first  # once is enough
