"""Property: thinking goes back to Anthropic only from this profile's own answers.

Random histories, with caller-side ``reasoning_content`` on assistant turns and
store items written by several profiles and providers, go through the adapter's
``prepare``; every thinking block in the body must be one this profile stored,
and no caller reasoning may appear anywhere in it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boundedcode_gateway.config import parse_config
from boundedcode_gateway.providers.anthropic.adapter import (
    ANTHROPIC_CAPABILITIES,
    AnthropicUpstream,
)
from boundedcode_gateway.providers.anthropic.response import THINKING_KIND
from boundedcode_gateway.providers.base import ChatCall, RequestOptions
from boundedcode_gateway.providers.registry import REASONING_FILES
from boundedcode_gateway.reasoning_store.keys import message_keys
from boundedcode_gateway.reasoning_store.store import ReasoningItem, ReasoningStore, TaskReasoning

CONFIG = parse_config(
    """
models:
  claude: {provider: anthropic, model: claude-sonnet-4-5, api_key_env: PROVENANCE_KEY,
           thinking: {budget_tokens: 2048}}
"""
)
OPTIONS = RequestOptions(stream=False, include_usage=False, return_progress=False)
WRITERS = [("anthropic", "claude"), ("anthropic", "opus"), ("openai", "gpt"), ("local", "claude")]

turns = st.lists(
    st.tuples(
        st.booleans(),  # with a tool call
        st.text(alphabet="abc ", max_size=6),  # the answer's text
        st.one_of(st.none(), st.text(alphabet="xyz", min_size=1, max_size=8)),  # caller reasoning
        st.one_of(st.none(), st.sampled_from(range(len(WRITERS)))),  # who the store says wrote it
    ),
    min_size=1,
    max_size=6,
)


def _history(spec: list[tuple[bool, str, str | None, int | None]]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for n, (tool, text, reasoning, _) in enumerate(spec):
        messages.append({"role": "user", "content": f"question {n}"})
        turn: dict[str, Any] = {"role": "assistant", "content": text or None}
        if tool or not text:
            turn["tool_calls"] = [
                {
                    "id": f"toolu_{n}",
                    "type": "function",
                    "function": {"name": "f", "arguments": "{}"},
                }
            ]
        if reasoning is not None:
            turn["reasoning_content"] = "CALLER-" + reasoning
        messages.append(turn)
        if "tool_calls" in turn:
            messages.append({"role": "tool", "tool_call_id": f"toolu_{n}", "content": "r"})
    messages.append({"role": "user", "content": "next"})
    return messages


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVENANCE_KEY", "sk-ant-provenance")


@settings(max_examples=80, deadline=None)
@given(spec=turns)
def test_only_this_profiles_thinking_goes_back(
    spec: list[tuple[bool, str, str | None, int | None]],
) -> None:
    messages = _history(spec)
    with tempfile.TemporaryDirectory() as folder:
        store = ReasoningStore(Path(folder), REASONING_FILES)
        own: set[str] = set()
        assistant_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        for i, (_, _, _, writer) in zip(assistant_at, spec, strict=True):
            if writer is None:
                continue
            provider, profile = WRITERS[writer]
            signature = f"sig-{i}-{profile}-{provider}"
            block = {"type": "thinking", "thinking": f"t{i}", "signature": signature}
            keys = tuple(message_keys(messages, i))
            store.put("t", ReasoningItem(THINKING_KIND, keys, provider, profile, [[0, block]]))
            if (provider, profile) == ("anthropic", "claude"):
                own.add(signature)
        upstream = AnthropicUpstream("claude", CONFIG.models["claude"], CONFIG, None)  # type: ignore[arg-type]
        call = ChatCall(
            {"model": "claude", "messages": messages},
            OPTIONS,
            ANTHROPIC_CAPABILITIES,
            None,
            TaskReasoning(store, "t"),
            "call-1",
        )
        prepared = upstream.prepare(call, send_schema=False)
        store.close()
    body = orjson.loads(prepared.body)
    sent = {
        b["signature"]
        for m in body["messages"]
        for b in m["content"]
        if b.get("type") == "thinking"
    }
    assert sent == own
    assert b"CALLER-" not in prepared.body
    assert b"reasoning_content" not in prepared.body
