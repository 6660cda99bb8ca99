"""A fault inside the gateway itself: an OpenAI-shaped 500 ``internal_error``, recorded as such.

The faults are injected into one profile's adapter of a running gateway, the way a bug
in a translation would show: a plain exception, not one of the gateway's errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import orjson
import pytest

from boundedcode_gateway.policy import structured
from boundedcode_gateway.providers.base import RequestOptions, StreamTranslator
from boundedcode_gateway.providers.openai_compat.stream import OpenAIStreamTranslator
from boundedcode_gateway.upstream.metrics import CallMetrics
from tests.e2e.conftest import Gateway, Upstreams
from tests.fakes.common import Reply, parse_sse

ASK = [{"role": "user", "content": "hello"}]
SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "a", "schema": {"type": "object"}},
}


class Bug(Exception):
    """What a bug in an adapter raises."""


def _raise_bug(raw: bytes, metrics: CallMetrics, options: RequestOptions) -> bytes:
    raise Bug("a bug in from_response")


class TranslatorWithABug(OpenAIStreamTranslator):
    """The real translator, raising at the first event after ``after_events`` events."""

    def __init__(self, options: RequestOptions, after_events: int) -> None:
        super().__init__(options)
        self.events_left = after_events

    def feed(self, event: str, data: bytes) -> Sequence[bytes]:
        if self.events_left == 0:
            raise Bug("a bug in a stream translator")
        self.events_left -= 1
        return super().feed(event, data)


def post(gw: Gateway, stream: bool) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        timeout=10,
        json={"model": "gpt", "messages": ASK, "stream": stream},
    )


def assert_internal_error(body: object) -> None:
    assert isinstance(body, dict)
    error = body["error"]
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    assert "its log has the details" in error["message"]
    assert "a bug in" not in error["message"]  # the fault's own text stays in the log


def assert_recorded(gw: Gateway) -> None:
    call = gw.calls()[0]
    assert (call["status"], call["http_status"], call["error_code"]) == (
        "error",
        500,
        "internal_error",
    )
    row = gw.ledger_rows()[0]
    assert (row["http_status"], row["error_code"]) == (500, "internal_error")


def test_a_fault_reading_a_whole_answer(gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway.app.upstreams["gpt"], "from_response", _raise_bug)
    resp = post(gateway, stream=False)
    assert resp.status_code == 500
    assert resp.headers["content-type"] == "application/json"
    assert_internal_error(resp.json())
    assert_recorded(gateway)


def test_a_fault_before_the_stream_commits(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    def translator(options: RequestOptions) -> StreamTranslator:
        return TranslatorWithABug(options, after_events=0)

    monkeypatch.setattr(gateway.app.upstreams["gpt"], "stream_translator", translator)
    resp = post(gateway, stream=True)
    assert resp.status_code == 500
    assert resp.headers["content-type"] == "application/json"
    assert_internal_error(resp.json())
    assert_recorded(gateway)


def test_a_fault_after_content_was_shown(
    gateway: Gateway, upstreams: Upstreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstreams.openai.queue(Reply(content="one two three four five six"))

    def translator(options: RequestOptions) -> StreamTranslator:
        return TranslatorWithABug(options, after_events=3)

    monkeypatch.setattr(gateway.app.upstreams["gpt"], "stream_translator", translator)
    resp = post(gateway, stream=True)
    assert resp.status_code == 200
    events = parse_sse(resp.content)
    assert any(e["choices"][0]["delta"].get("content") for e in events[:-1])  # content shown
    assert_internal_error(events[-1])  # then the error, and no [DONE]
    assert_recorded(gateway)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_fault_after_the_upstream_finished(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """The answer was complete upstream, then the gateway failed on it: an error all the same."""

    def check_reply(text: str | None, finish: str | None, schema: dict[str, Any]) -> bool:
        raise Bug("a bug in the reply check")

    monkeypatch.setattr(structured, "schema_verdict", check_reply)
    resp = httpx.post(
        gateway.url + "/v1/chat/completions",
        timeout=10,
        json={"model": "gpt", "messages": ASK, "stream": stream, "response_format": SCHEMA},
    )
    if stream:
        assert resp.status_code == 200
        events = parse_sse(resp.content)
        assert_internal_error(events[-1])
    else:
        assert resp.status_code == 500
        assert_internal_error(resp.json())
    assert_recorded(gateway)


def test_a_fault_outside_a_call(gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    async def capabilities() -> None:
        raise Bug("a bug in capabilities")

    monkeypatch.setattr(gateway.app.upstreams["gpt"], "capabilities", capabilities)
    resp = httpx.get(gateway.url + "/v1/models/gpt", timeout=10)
    assert resp.status_code == 500
    assert resp.headers["content-type"] == "application/json"
    assert_internal_error(orjson.loads(resp.content))


def test_a_fault_in_a_fronts_reading_of_a_request(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in how a front reads its request is a 500 in its own shape, recorded."""
    front = gateway.app.router.fronts["/v1/messages"]

    def open_with_a_bug(parsed: Any, headers: Any) -> None:
        raise Bug("a bug in a front")

    monkeypatch.setattr(front, "open", open_with_a_bug)
    resp = httpx.post(
        gateway.url + "/v1/messages",
        timeout=10,
        headers={"anthropic-version": "2023-06-01"},
        json={"model": "gpt", "max_tokens": 10, "messages": ASK},
    )
    assert resp.status_code == 500
    error = resp.json()["error"]
    assert error["type"] == "api_error" and "a bug in" not in error["message"]
    call = gateway.calls()[0]
    assert (call["front"], call["http_status"], call["error_code"]) == (
        "messages",
        500,
        "internal_error",
    )
