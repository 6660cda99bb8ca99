"""The fake Gemini API refuses what the real one documents refusing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fakes.common import Reply, parse_sse
from tests.fakes.gemini_api import MISSING_SIGNATURE, PLACEHOLDER, FakeGemini
from tests.fakes.server import RunningServer, serve_in_thread

KEY = "k-123"


@pytest.fixture
def fake() -> Iterator[tuple[FakeGemini, RunningServer]]:
    gemini = FakeGemini(api_key=KEY)
    with serve_in_thread(gemini.app) as server:
        yield gemini, server


def generate(server: RunningServer, body: Any, stream: bool = False) -> httpx.Response:
    action = "streamGenerateContent?alt=sse" if stream else "generateContent"
    url = f"{server.url}/v1beta/models/gemini-3-pro-preview:{action}"
    return httpx.post(url, json=body, headers={"x-goog-api-key": KEY}, timeout=10)


USER = {"role": "user", "parts": [{"text": "Go"}]}


def test_unknown_fields_are_refused_by_the_sdk_types(fake: tuple[FakeGemini, Any]) -> None:
    _, server = fake
    bad = {"contents": [{"role": "user", "parts": [{"txt": "x"}]}]}
    assert generate(server, bad).status_code == 400
    both = {
        "contents": [USER],
        "generationConfig": {"thinkingConfig": {"thinkingLevel": "low", "thinkingBudget": 5}},
    }
    assert generate(server, both).status_code == 400
    assert generate(server, {"contents": [USER], "messages": []}).status_code == 400


def test_signatures_are_issued_and_enforced(fake: tuple[FakeGemini, Any]) -> None:
    gemini, server = fake
    calls = [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]
    gemini.queue(Reply(content="", tool_calls=calls))
    parts = generate(server, {"contents": [USER]}).json()["candidates"][0]["content"]["parts"]
    assert "thoughtSignature" in parts[0] and "thoughtSignature" not in parts[1]
    results = {
        "role": "user",
        "parts": [{"functionResponse": {"name": n, "response": {}}} for n in "ab"],
    }

    def send(model_parts: list[Any]) -> httpx.Response:
        body = {"contents": [USER, {"role": "model", "parts": model_parts}, results]}
        return generate(server, body)

    assert send(parts).status_code == 200
    bare = [{"functionCall": p["functionCall"]} for p in parts]
    refused = send(bare)
    assert refused.status_code == 400
    assert refused.json()["error"] == {
        "code": 400,
        "message": MISSING_SIGNATURE.format(name="a", position=1),
        "status": "INVALID_ARGUMENT",
    }
    assert send([{**bare[0], "thoughtSignature": PLACEHOLDER}, bare[1]]).status_code == 200
    assert send([{**bare[0], "thoughtSignature": "Zm9yZWlnbg=="}, bare[1]]).status_code == 400
    # the signature of another call does not sign this one
    moved = [{**bare[1], "thoughtSignature": parts[0]["thoughtSignature"]}, bare[0]]
    assert send(moved).status_code == 400
    # one result for two calls
    short = {
        "contents": [
            USER,
            {"role": "model", "parts": parts},
            {**results, "parts": results["parts"][:1]},
        ]
    }
    assert generate(server, short).status_code == 400


def test_stream_ends_with_a_signature_only_part(fake: tuple[FakeGemini, Any]) -> None:
    gemini, server = fake
    gemini.queue(Reply(content="one two three"))
    events = parse_sse(generate(server, {"contents": [USER]}, stream=True).content)
    assert "[DONE]" not in events
    last = events[-1]["candidates"][0]
    assert last["finishReason"] == "STOP"
    assert last["content"]["parts"] == [
        {"text": "", "thoughtSignature": last["content"]["parts"][0]["thoughtSignature"]}
    ]
    assert all("finishReason" not in e["candidates"][0] for e in events[:-1])
