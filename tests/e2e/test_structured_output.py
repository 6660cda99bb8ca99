"""Structured output through the gateway: the one-time fallback, remembered per profile,
the reply checked, key order kept, and the typed helper."""

from __future__ import annotations

from typing import Any, Literal

import httpx
import pytest
from pydantic import BaseModel

from boundedcode_gateway.client import StructuredOutputError, structured_call
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply
from tests.outcomes import outcomes

SCHEMA = {
    "type": "object",
    "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "string"}},
    "required": ["zeta", "alpha"],
}
REFUSAL = {
    "error": {
        "message": "Invalid schema for response_format 'answer': this model does "
        "not support json_schema",
        "type": "invalid_request_error",
        "param": "response_format",
        "code": None,
    }
}
ASK: list[Any] = [{"role": "user", "content": "Answer as JSON with zeta then alpha."}]


def ask(gw: Gateway, model: str) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        timeout=10,
        json={
            "model": model,
            "messages": ASK,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": SCHEMA},
            },
        },
    )


def test_refused_schema_is_dropped_once_and_remembered(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    profiles = {**upstreams.profiles, "glm2": upstreams.profiles["glm"]}
    gw = start_gateway(profiles)
    compat = upstreams.compat
    compat.queue(
        Reply(status=400, error_body=REFUSAL),
        Reply(content='{"zeta": 1, "alpha": "a"}'),
        Reply(content='{"zeta": 2, "alpha": "b"}'),
        Reply(content="not json"),
    )
    first = ask(gw, "glm")
    assert first.status_code == 200
    bodies = [r.body for r in compat.requests]
    assert len(bodies) == 2
    assert bodies[0]["response_format"]["json_schema"]["strict"] is True
    assert "response_format" not in bodies[1]
    ask(gw, "glm")  # the next call goes without the schema at once
    assert len(compat.requests) == 3 and "response_format" not in compat.requests.last.body
    ask(gw, "glm2")  # another profile still sends it
    assert "response_format" in compat.requests.last.body
    calls = gw.calls()
    assert [c["structured_output"] for c in calls] == [
        "dropped_after_rejection",
        "skipped_known_rejection",
        "sent",
    ]
    assert calls[0]["attempts"] == 2 and calls[0]["status"] == "ok"
    assert outcomes(calls[0]["attempt_log"]) == [
        {"status": 400, "code": None},
        {"status": 200, "code": None},
    ]
    assert calls[2]["schema_valid"] is False  # "not json"
    models = httpx.get(gw.url + "/v1/models", timeout=10).json()["data"]
    caps = {m["id"]: m["capabilities"]["structured_output"] for m in models}
    assert caps["glm"] is False and caps["glm2"] is True


def test_valid_reply_is_recorded_and_key_order_kept(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.openai.queue(Reply(content='{"zeta": 3, "alpha": "x"}'))
    resp = ask(gateway, "gpt")
    assert resp.json()["choices"][0]["message"]["content"] == '{"zeta": 3, "alpha": "x"}'
    sent_schema = upstreams.openai.requests.last.body["response_format"]["json_schema"]["schema"]
    assert list(sent_schema["properties"]) == ["zeta", "alpha"]
    call = gateway.calls()[0]
    assert call["structured_output"] == "sent" and call["schema_valid"] is True


def test_stream_reply_is_checked_too(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.llama.queue(Reply(content='{"zeta": 4, "alpha": "y"}'))
    resp = httpx.post(
        gateway.url + "/v1/chat/completions",
        timeout=10,
        json={
            "model": "local",
            "messages": ASK,
            "stream": True,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": SCHEMA},
            },
        },
    )
    assert resp.status_code == 200
    assert gateway.calls()[0]["schema_valid"] is True
    # llama.cpp gets the schema where it reads it, not in the strict form
    assert upstreams.llama.requests.last.body["response_format"]["json_schema"] == {
        "name": "a",
        "schema": SCHEMA,
    }


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


@pytest.mark.parametrize(("model", "stream"), [("gpt", False), ("local", True)])
def test_a_tool_call_answer_has_no_reply_to_check(
    gateway: Gateway,
    upstreams: Upstreams,
    caplog: pytest.LogCaptureFixture,
    model: str,
    stream: bool,
) -> None:
    fake = upstreams.openai if model == "gpt" else upstreams.llama
    fake.queue(Reply(content="", tool_calls=[{"name": "lookup", "arguments": {"q": "x"}}]))
    resp = httpx.post(
        gateway.url + "/v1/chat/completions",
        timeout=10,
        json={
            "model": model,
            "messages": ASK,
            "tools": TOOLS,
            "stream": stream,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": SCHEMA},
            },
        },
    )
    assert resp.status_code == 200 and "lookup" in resp.text
    call = gateway.calls()[0]
    assert call["finish_reason"] == "tool_calls"
    assert call["structured_output"] == "sent" and call["schema_valid"] is None
    assert "does not match the schema" not in caplog.text


def test_no_schema_no_field(gateway: Gateway, upstreams: Upstreams) -> None:
    gateway.client().chat.completions.create(model="gpt", messages=ASK)
    call = gateway.calls()[0]
    assert call["structured_output"] is None and call["schema_valid"] is None


class Verdict(BaseModel):
    zeta: int
    alpha: Literal["yes", "no"]


def test_structured_call_returns_a_model(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.openai.queue(Reply(content='{"zeta": 5, "alpha": "yes"}'))
    verdict = structured_call(
        gateway.url + "/v1", "gpt", ASK, Verdict, purpose="ambiguity_check", task="t-9"
    )
    assert verdict == Verdict(zeta=5, alpha="yes")
    sent = upstreams.openai.requests.last
    assert list(sent.body["response_format"]["json_schema"]["schema"]["properties"]) == [
        "zeta",
        "alpha",
    ]
    call = gateway.calls()[0]
    assert (call["purpose"], call["task"]) == ("ambiguity_check", "t-9")


def test_structured_call_raises_on_a_bad_reply(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.openai.queue(Reply(content="I think the answer is yes."))
    with pytest.raises(StructuredOutputError) as info:
        structured_call(gateway.url + "/v1", "gpt", ASK, Verdict)
    assert info.value.reply == "I think the answer is yes."
    with pytest.raises(StructuredOutputError, match="404"):
        structured_call(gateway.url + "/v1", "nope", ASK, Verdict)
