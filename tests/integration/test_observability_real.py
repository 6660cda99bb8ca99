"""Traces of calls the clients people use make to the real llama-server, read back from
Phoenix: the newest openai and anthropic SDKs and LiteLLM each send the caller's
traceparent, and the call's span, its caller's child, carries what the server reported
(evaluated tokens, prefill and decode, the server, what the cache served)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from boundedcode_gateway.unique_ids import hex_id
from tests.e2e.conftest import Gateway
from tests.integration.conftest import MODEL, start_real_gateway
from tests.receivers.phoenix import Phoenix

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
import litellm

ASK: list[Any] = [{"role": "user", "content": "Name one colour."}]


@pytest.fixture(scope="module")
def traced() -> Iterator[tuple[Gateway, Phoenix]]:
    with Phoenix() as phoenix:
        profile = {"provider": "local", "model_path": MODEL, "server": {"ctx_size": 4096}}
        with tempfile.TemporaryDirectory() as data:
            gw = start_real_gateway(
                Path(data),
                {"smol": profile},
                observability={"endpoint": phoenix.otlp_http_endpoint, "metrics": False},
            )
            try:
                yield gw, phoenix
            finally:
                gw.stop()


def traceparent() -> tuple[str, str, dict[str, str]]:
    trace_id, span_id = hex_id(128), hex_id(64)
    return trace_id, span_id, {"traceparent": f"00-{trace_id}-{span_id}-01"}


def calls(gw: Gateway, phoenix: Phoenix, trace_id: str, n: int) -> list[dict[str, Any]]:
    """The ``n`` call spans of the trace, earliest first."""
    assert gw.app.bus.flush(10.0)
    export = gw.app.observability.export
    assert export is not None and export.flush(10.0)
    found = phoenix.spans(trace_id=trace_id, wait_for=n)
    out = [s for s in found if s["name"] == "chat smol"]
    assert len(out) == n, [s["name"] for s in found]
    return out


def test_the_openai_sdk_callers_trace_holds_the_real_servers_work(
    traced: tuple[Gateway, Phoenix],
) -> None:
    gw, phoenix = traced
    trace_id, parent, headers = traceparent()
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    for _ in range(2):  # the second turn is read from the first's cache
        client.chat.completions.create(
            model="smol",
            messages=ASK,
            max_tokens=8,
            extra_headers={**headers, "X-BoundedCode-Task": "colours"},
        )
    client.close()
    first = calls(gw, phoenix, trace_id, 2)[0]
    assert first["parent_span_id"] == parent
    a = first["attributes"]
    assert a["gen_ai.provider.name"] == "llama.cpp" and a["boundedcode.server"] == "smol"
    assert a["boundedcode.evaluated_tokens"] > 0 and a["boundedcode.prefill_ms"] > 0
    assert a["boundedcode.decode_ms"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    # each span says what the server reported for its call, as the call log does
    logged = {c["call_id"]: c for c in gw.calls() if c["task"] == "colours"}
    for span in calls(gw, phoenix, trace_id, 2):
        got = span["attributes"]
        record = logged[got["boundedcode.call_id"]]
        assert got["gen_ai.usage.input_tokens"] == record["prompt_tokens"]
        assert got["gen_ai.usage.cache_read.input_tokens"] == record["cached_tokens"]
        assert got["boundedcode.evaluated_tokens"] == record["evaluated_tokens"]
        assert got.get("boundedcode.miss_cause") == record["miss_cause"]


def test_the_anthropic_sdk_through_the_messages_front(traced: tuple[Gateway, Phoenix]) -> None:
    gw, phoenix = traced
    trace_id, parent, headers = traceparent()
    client = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0)
    client.messages.create(
        model="smol",
        max_tokens=8,
        messages=ASK,
        extra_headers=headers,
    )
    client.close()
    [call] = calls(gw, phoenix, trace_id, 1)
    assert call["parent_span_id"] == parent
    assert call["attributes"]["boundedcode.front"] == "messages"


def test_litellm_passes_the_callers_traceparent(traced: tuple[Gateway, Phoenix]) -> None:
    gw, phoenix = traced
    trace_id, parent, headers = traceparent()
    litellm.completion(
        model="openai/smol",
        api_base=gw.url + "/v1",
        api_key="unused",
        messages=ASK,
        max_tokens=8,
        num_retries=0,
        extra_headers=headers,
    )
    [call] = calls(gw, phoenix, trace_id, 1)
    assert call["parent_span_id"] == parent
    assert call["attributes"]["gen_ai.request.model"] == "smol"
