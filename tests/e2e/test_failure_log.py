"""What an operator sees of failed and refused calls: one line on the gateway's stderr per
such call (and none for the rest), and a refused request's record keeping what it asked."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from boundedcode_gateway.access.keys import key_digest, new_key
from boundedcode_gateway.metering.calllog import read_calls
from boundedcode_gateway.operations.failure_log import LOGGER_NAME
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.e2e.test_cli import free_port, start_serve, write_config
from tests.fakes.common import Reply
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import serve_in_thread

VERSION = {"anthropic-version": "2023-06-01"}
# made fresh for each run: found in the output, it can only have been written by the gateway
KEY = new_key()
SECRET = "the-secret-in-a-message-" + new_key()[-12:]


def lines_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER_NAME]


@pytest.fixture
def logged(gateway: Gateway, caplog: pytest.LogCaptureFixture) -> Iterator[Any]:
    """The failure lines the gateway wrote so far (its own thread's, once flushed)."""
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)

    def read() -> list[str]:
        assert gateway.app.bus.flush(10.0)
        assert gateway.app.failures.flush(10.0)
        return lines_of(caplog)

    yield read


def test_serve_writes_a_line_per_refusal_on_stderr_and_never_a_key_or_content(
    tmp_path: Path,
) -> None:
    """As an operator runs it: `boundedcode-gateway serve`, with a key in its configuration
    and a secret in the refused requests' messages."""
    fake = FakeLlamaServer()
    with serve_in_thread(fake.app) as upstream:
        auth = {"keys": [{"name": "ci", "sha256": key_digest(KEY), "models": ["*"]}]}
        config = write_config(tmp_path, upstream.url, auth=auth)
        port = free_port()
        proc = start_serve(config, port)
        base = f"http://127.0.0.1:{port}"
        try:
            with httpx.Client(base_url=base, timeout=10) as http:
                chat = http.post(
                    "/v1/chat/completions",
                    headers={"Authorization": f"Bearer {KEY}"},
                    json={"model": "local", "messages": [{"role": "robot", "content": SECRET}]},
                )
                messages = http.post(
                    "/v1/messages",
                    headers={"x-api-key": KEY, **VERSION},
                    json={
                        "model": "local",
                        "max_tokens": 64,
                        "stream": True,
                        "messages": [
                            {"role": "user", "content": SECRET},
                            {"role": "robot", "content": "and again " + SECRET},
                        ],
                    },
                )
                wrong_key = http.post(
                    "/v1/chat/completions",
                    headers={"Authorization": "Bearer not-" + KEY},
                    json={"model": "local", "messages": [{"role": "user", "content": SECRET}]},
                )
        finally:
            proc.send_signal(signal.SIGTERM)
            output = proc.communicate(timeout=30)[0].decode()
    assert (chat.status_code, messages.status_code, wrong_key.status_code) == (400, 400, 401)
    refusals = [line for line in output.splitlines() if "call refused:" in line]
    assert len(refusals) == 3, output
    chat_line, messages_line, key_line = refusals
    assert "WARNING boundedcode_gateway.calls: call refused: front=chat model=local " in chat_line
    assert "status=400" in chat_line and "caller=ci" in chat_line and "message=" in chat_line
    assert "front=messages model=local status=400" in messages_line
    assert "stream=true" in messages_line
    assert "front=chat status=401" in key_line and "recorded=false" in key_line
    # neither the key (nor the wrong one), nor any message's content, nor a header
    assert KEY not in output and SECRET not in output
    assert "Bearer" not in output and "anthropic-version: 2023" not in output
    records = read_calls(tmp_path / "data" / "calls.jsonl")
    assert [(r["front"], r["http_status"]) for r in records] == [("chat", 400), ("messages", 400)]
    assert all(SECRET not in str(r) and KEY not in str(r) for r in records)


def test_a_refused_streamed_messages_request_keeps_what_it_asked(
    gateway: Gateway, logged: Any
) -> None:
    body = {
        "model": "local",
        "max_tokens": 64,
        "stream": True,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "robot", "content": "?"},
        ],
    }
    reply = httpx.post(gateway.url + "/v1/messages", json=body, headers=VERSION, timeout=10)
    assert reply.status_code == 400
    (record,) = gateway.calls()
    assert (record["front"], record["model_profile"]) == ("messages", "local")
    assert record["stream"] is True  # as the request said, though it was refused
    assert record["messages"] == 3 and record["provider"] == "local"
    assert record["status"] == "error" and record["http_status"] == 400
    assert record["error_message"]
    (line,) = logged()
    assert line.startswith("call refused: front=messages model=local status=400 ")
    assert "stream=true provider=local" in line and f"call_id={record['call_id']}" in line


def test_a_refused_responses_request_keeps_what_it_asked(gateway: Gateway, logged: Any) -> None:
    body = {
        "model": "gpt",
        "stream": True,
        "background": True,
        "input": [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}],
    }
    reply = httpx.post(gateway.url + "/v1/responses", json=body, timeout=10)
    assert reply.status_code == 400
    (record,) = gateway.calls()
    assert (record["front"], record["stream"], record["messages"]) == ("responses", True, 2)
    assert (record["provider"], record["error_code"]) == ("openai", "unsupported_parameter")
    (line,) = logged()
    assert line.startswith(
        "call refused: front=responses model=gpt status=400 code=unsupported_parameter "
        "stream=true provider=openai"
    )
    assert "background" in line  # the message says what was refused


def test_a_chat_refusal_and_an_unknown_model(gateway: Gateway, logged: Any) -> None:
    client = gateway.client(task="t-1")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="local",
            messages=[{"role": "robot", "content": "hi"}],  # type: ignore[list-item,misc]
        )
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="nope", stream=True, messages=[{"role": "user", "content": "hi"}]
        )
    refused, unknown = gateway.calls()
    assert (refused["front"], refused["messages"], refused["provider"]) == ("chat", 1, "local")
    # a model that names no profile has no provider, but the stream it asked for is kept
    assert (unknown["stream"], unknown["provider"], unknown["http_status"]) == (True, None, 404)
    first, second = logged()
    assert first.startswith("call refused: front=chat model=local status=400 ")
    assert "task=t-1" in first
    assert second.startswith("call refused: front=chat model=nope status=404 code=model_not_found")


def test_a_stream_broken_after_content_is_a_failure_line(
    gateway: Gateway, upstreams: Upstreams, logged: Any
) -> None:
    # a cloud API cannot go on from where it broke, and this caller cannot drop what it had
    upstreams.openai.queue(Reply(content="one two three four five six", break_after_chunks=3))
    stream = gateway.client().chat.completions.create(
        model="gpt", stream=True, messages=[{"role": "user", "content": "count"}]
    )
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    (record,) = gateway.calls()
    assert (record["status"], record["http_status"]) == ("error", 502)
    assert record["error_code"] == "upstream_stream_broken" and record["stream"] is True
    (line,) = logged()
    assert line.startswith(
        "call failed: front=chat model=gpt status=502 code=upstream_stream_broken stream=true "
        "after_content=true"
    )


def test_no_line_for_an_answered_call_or_a_caller_that_left(
    gateway: Gateway, upstreams: Upstreams, logged: Any
) -> None:
    upstreams.llama.queue(Reply(content="fine"), Reply(content="slow", delay_ms=3000))
    client = gateway.client()
    client.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.5).chat.completions.create(
            model="local", messages=[{"role": "user", "content": "hi"}]
        )
    # the call that timed out ends at the gateway once it sees the caller gone
    answered, left = _wait_two(gateway)
    assert answered["status"] == "ok"
    assert (left["http_status"], left["error_code"]) == (499, "client_disconnected")
    assert logged() == []


def _wait_two(gateway: Gateway) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while len(calls := gateway.calls()) < 2:
        assert time.monotonic() < deadline, calls
        time.sleep(0.05)
    return calls


def test_a_streamed_call_over_its_budget_is_a_429_line_and_keeps_its_stream(
    upstreams: Upstreams, start_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    budget = {"max_tokens": 1, "per": "day"}
    ci = {"name": "ci", "sha256": key_digest("ci"), "models": ["*"], "budget": budget}
    gw = start_gateway(upstreams.profiles, auth={"keys": [ci]})
    client = gw.client(api_key="ci")
    client.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(
            model="local", stream=True, messages=[{"role": "user", "content": "again"}]
        )
    _, refused = gw.calls()
    assert (refused["http_status"], refused["error_code"]) == (429, "budget_exceeded")
    assert (refused["stream"], refused["provider"], refused["messages"]) == (True, "local", 1)
    assert gw.app.failures.flush(10.0)
    (line,) = lines_of(caplog)
    assert line.startswith(
        "call refused: front=chat model=local status=429 code=budget_exceeded stream=true "
        "provider=local"
    )
    assert "caller=ci" in line and "Budget exceeded" in line
