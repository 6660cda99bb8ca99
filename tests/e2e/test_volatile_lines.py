"""A system prompt whose first line changes on every request (Claude Code's billing
header): a local server sees it without that line and serves the next turn from its
cache; a cloud API gets the prompt as sent."""

from __future__ import annotations

from typing import Any

from tests.e2e.conftest import Gateway, Upstreams

PROMPT = "You are Claude Code, Anthropic's official CLI for Claude. " + "Be exact. " * 80


def system(nonce: str) -> dict[str, Any]:
    billing = f"x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch={nonce};"
    return {
        "role": "system",
        "content": [{"type": "text", "text": billing}, {"type": "text", "text": PROMPT}],
    }


def test_two_turns_differing_only_in_the_nonce_share_the_cache(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    client = gateway.client("claude-code")
    history: list[Any] = [{"role": "user", "content": "List the files."}]
    first = client.chat.completions.create(model="local", messages=[system("fa690"), *history])  # type: ignore[list-item]
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Now read the first one."},
    ]
    client.chat.completions.create(model="local", messages=[system("0aaa9"), *history])  # type: ignore[list-item]
    calls = gateway.calls()
    assert [c["adjustments"].get("volatile_lines_removed") for c in calls] == [
        ["claude_code_billing_header"]
    ] * 2
    second = calls[1]
    # everything up to the new turn came from the cache
    assert second["miss_cause"] == "none", second
    assert second["cached_tokens"] >= calls[0]["prompt_tokens"]
    sent = [b["messages"][0] for b in upstreams.llama.requests.bodies("/v1/chat/completions")]
    assert all("x-anthropic-billing-header" not in str(m) for m in sent)


def test_a_cloud_api_gets_the_prompt_as_sent(gateway: Gateway, upstreams: Upstreams) -> None:
    gateway.client().chat.completions.create(
        model="gpt",
        messages=[system("fa690"), {"role": "user", "content": "hi"}],  # type: ignore[list-item]
    )
    [body] = upstreams.openai.requests.bodies("/v1/chat/completions")
    assert "cch=fa690" in str(body["messages"][0])
    assert "volatile_lines_removed" not in gateway.calls()[0]["adjustments"]
