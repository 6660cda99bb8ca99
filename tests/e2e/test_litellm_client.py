"""LiteLLM's client, which we did not write, reads the gateway's errors as it should."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply

# LiteLLM fetches a price list over the network when imported unless told not to
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
import litellm
from litellm.exceptions import ContextWindowExceededError


def complete(gw: Gateway, model: str, messages: list[Any], **extra: Any) -> Any:
    return litellm.completion(
        model=f"openai/{model}",
        api_base=gw.url + "/v1",
        api_key="unused",
        messages=messages,
        num_retries=0,
        **extra,
    )


def test_litellm_reads_context_overflow(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    upstreams.llama.n_ctx = 16
    gw = start_gateway(upstreams.profiles)
    with pytest.raises(ContextWindowExceededError):
        complete(gw, "local", [{"role": "user", "content": "word " * 60}])


def test_litellm_chat_and_stream(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.openai.queue(Reply(content="Hello from the cloud."), Reply(content="Streamed hello."))
    reply = complete(gateway, "gpt", [{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "Hello from the cloud."
    chunks = list(complete(gateway, "gpt", [{"role": "user", "content": "hi"}], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Streamed hello."


def test_litellm_stream_of_an_answer_opening_with_an_emoji(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    upstreams.llama.queue(Reply(content="🌟 Hello, team!", reasoning_content=None))
    chunks = list(complete(gateway, "local", [{"role": "user", "content": "hi"}], stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    built = litellm.stream_chunk_builder(chunks)
    assert built is not None
    assert built.choices[0].message.role == "assistant"  # type: ignore[union-attr]
    assert built.choices[0].message.content == "🌟 Hello, team!"  # type: ignore[union-attr]
