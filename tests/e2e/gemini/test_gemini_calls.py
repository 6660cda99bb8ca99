"""Gemini through the gateway: the request it gets, structured output and its fallback,
errors and retries, broken streams, capabilities."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from boundedcode_gateway.errors import ConfigError
from tests.e2e.conftest import GatewayFactory
from tests.e2e.gemini.conftest import GEMINI_KEY, GeminiSetup
from tests.fakes.common import Reply, parse_sse
from tests.fakes.gemini_api import gemini_error_body

ASK: list[Any] = [{"role": "user", "content": "Say hello."}]
SCHEMA = {
    "type": "object",
    "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "string"}},
    "required": ["zeta", "alpha"],
}


def post(url: str, **body: Any) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=20)


def test_request_reaches_gemini_as_documented(
    gem: GeminiSetup, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(gem.profiles)
    gw.client().chat.completions.create(
        model="gem",
        messages=[{"role": "developer", "content": "Be brief."}, *ASK],
        temperature=0.3,
        top_p=0.9,
        max_completion_tokens=64,
        stop=["END"],
        reasoning_effort="low",
    )
    req = gem.gemini.requests.last
    assert req.path == "/v1beta/models/gemini-3-pro-preview:generateContent"
    assert req.header("x-goog-api-key") == GEMINI_KEY
    assert req.header("authorization") is None
    assert req.body == {
        "contents": [{"role": "user", "parts": [{"text": "Say hello."}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {
            "temperature": 0.3,
            "topP": 0.9,
            "maxOutputTokens": 64,
            "stopSequences": ["END"],
            "thinkingConfig": {"thinkingLevel": "low", "includeThoughts": True},
        },
    }


def test_stream_goes_to_the_sse_endpoint_and_budget_models_get_a_budget(
    gem: GeminiSetup, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(gem.profiles)
    gem.gemini.queue(Reply(content="Hello, world.", reasoning_content="Greeting."))
    resp = post(gw.url, model="flash", messages=ASK, stream=True)
    assert resp.status_code == 200
    events = parse_sse(resp.content)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    thoughts = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks)
    assert (text, thoughts) == ("Hello, world.", "Greeting.")
    req = gem.gemini.requests.last
    assert req.path.endswith("/gemini-2.5-flash:streamGenerateContent") and req.query == "alt=sse"
    assert req.body["generationConfig"]["thinkingConfig"] == {
        "includeThoughts": True,
        "thinkingBudget": -1,
    }
    call = gw.calls()[0]
    assert call["finish_reason"] == "stop" and call["reasoning_tokens"] == 2


def test_structured_output_is_sent_as_response_json_schema(
    gem: GeminiSetup, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(gem.profiles)
    gem.gemini.queue(Reply(content='{"zeta": 1, "alpha": "a"}'))
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    resp = post(gw.url, model="gem", messages=ASK, response_format=fmt)
    assert resp.json()["choices"][0]["message"]["content"] == '{"zeta": 1, "alpha": "a"}'
    config = gem.gemini.requests.last.body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"] == SCHEMA
    assert list(config["responseJsonSchema"]["properties"]) == ["zeta", "alpha"]
    call = gw.calls()[0]
    assert call["structured_output"] == "sent" and call["schema_valid"] is True


def test_refused_schema_is_sent_once_more_without_it(
    gem: GeminiSetup, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(gem.profiles)
    refusal = gemini_error_body(
        400, 'Invalid JSON payload received. Unknown name "responseJsonSchema": Cannot find field.'
    )
    gem.gemini.queue(
        Reply(status=400, error_body=refusal), Reply(content='{"zeta": 2, "alpha": "b"}')
    )
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    assert post(gw.url, model="gem", messages=ASK, response_format=fmt).status_code == 200
    first, second = (r.body["generationConfig"] for r in gem.gemini.requests)
    assert "responseJsonSchema" in first
    assert "responseJsonSchema" not in second and "responseMimeType" not in second
    assert gw.calls()[0]["structured_output"] == "dropped_after_rejection"


def test_context_overflow_becomes_context_length_exceeded(
    gem: GeminiSetup, start_gateway: GatewayFactory
) -> None:
    gem.gemini.context_window = 10
    gw = start_gateway(gem.profiles)
    with pytest.raises(openai.BadRequestError) as info:
        gw.client().chat.completions.create(model="gem", messages=ASK * 5)
    body: Any = info.value.body
    assert body["code"] == "context_length_exceeded"
    assert "input token count" in body["message"]
    assert len(gem.gemini.requests) == 1


def test_other_errors_keep_their_status_in_openai_shape(
    gem: GeminiSetup, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(gem.profiles)
    gem.gemini.queue(Reply(status=403, error_body=gemini_error_body(403, "Permission denied.")))
    resp = post(gw.url, model="gem", messages=ASK)
    assert resp.status_code == 403
    assert resp.json() == {
        "error": {
            "message": "Permission denied.",
            "type": "permission_error",
            "param": None,
            "code": "permission_denied",
        }
    }
    assert len(gem.gemini.requests) == 1


def test_malformed_function_call_is_an_error(
    gem: GeminiSetup, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(gem.profiles)
    gem.gemini.queue(Reply(content="", finish_reason="MALFORMED_FUNCTION_CALL"))
    resp = post(gw.url, model="gem", messages=ASK)
    assert resp.status_code == 502
    assert resp.json()["error"]["code"] == "malformed_function_call"


def test_missing_key_is_named(
    gem: GeminiSetup, start_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = start_gateway(gem.profiles)
    monkeypatch.delenv("TEST_GEMINI_KEY")
    resp = post(gw.url, model="gem", messages=ASK)
    assert resp.status_code == 500
    assert "TEST_GEMINI_KEY" in resp.json()["error"]["message"]
    assert len(gem.gemini.requests) == 0


def test_capabilities_as_the_spec_says(gem: GeminiSetup, start_gateway: GatewayFactory) -> None:
    gw = start_gateway(gem.profiles)
    model = httpx.get(gw.url + "/v1/models/gem", timeout=10).json()
    caps = model["capabilities"]
    assert {k: caps[k] for k in ("streaming", "reasoning_back", "structured_output")} == {
        "streaming": True,
        "reasoning_back": True,
        "structured_output": True,
    }
    assert caps["prompt_progress"] is False and caps["source"] == "documentation"
    assert caps["continue_after_break"] is False
    assert model["owned_by"] == "gemini"


def test_both_level_and_budget_stop_start_up(
    gem: GeminiSetup, start_gateway: GatewayFactory
) -> None:
    bad = {**gem.profiles["gem"], "thinking": {"level": "low", "budget_tokens": 100}}
    with pytest.raises(ConfigError, match="not both"):
        start_gateway({"bad": bad})
