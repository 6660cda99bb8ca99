"""Streams: status held until content, errors before and after it, breaks, disconnects."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply, parse_sse
from tests.fakes.server import serve_in_thread

HELLO: list[Any] = [{"role": "user", "content": "hello there"}]
LLAMA_500 = {
    "code": 500,
    "message": "Failed to parse tool call arguments as JSON: x",
    "type": "server_error",
}


def stream_raw(gw: Gateway, model: str = "local", **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": HELLO, "stream": True, **extra}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=10)


def test_context_overflow_in_a_stream_is_a_real_400(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    upstreams.llama.n_ctx = 8
    gw = start_gateway(upstreams.profiles)
    with pytest.raises(openai.BadRequestError) as info:
        list(gw.client().chat.completions.create(model="local", messages=HELLO, stream=True))
    assert info.value.code == "context_length_exceeded"
    assert "exceeds the available context size" in info.value.message
    call = gw.calls()[0]
    assert call["http_status"] == 400 and call["error_code"] == "context_length_exceeded"


def test_error_event_after_content_is_an_in_stream_error(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    upstreams.llama.queue(
        Reply(
            content="one two three four five six",
            reasoning_content=None,
            error_event_after_chunks=4,
            error_event=LLAMA_500,
        )
    )
    resp = stream_raw(gateway)
    assert resp.status_code == 200
    events = parse_sse(resp.content)
    assert "[DONE]" not in events
    assert events[-1]["error"]["message"].startswith("Failed to parse tool call")
    assert any(
        e["choices"] and e["choices"][0]["delta"].get("content")
        for e in events[:-1]
        if isinstance(e, dict)
    )
    call = gateway.calls()[0]
    assert call["status"] == "error" and call["http_status"] == 500
    assert call["ttft_ms"] is not None


def test_sdk_raises_on_in_stream_error(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.llama.queue(
        Reply(content="a b c d e f g", error_event_after_chunks=4, error_event=LLAMA_500)
    )
    with pytest.raises(openai.APIError):
        list(gateway.client().chat.completions.create(model="local", messages=HELLO, stream=True))


def test_progress_forwarded_only_when_asked(gateway: Gateway, upstreams: Upstreams) -> None:
    long_prompt = [{"role": "user", "content": "word " * 300}]
    asked = httpx.post(
        gateway.url + "/v1/chat/completions",
        timeout=10,
        json={"model": "local", "messages": long_prompt, "stream": True, "return_progress": True},
    )
    progress = [
        e["prompt_progress"]
        for e in parse_sse(asked.content)
        if isinstance(e, dict) and "prompt_progress" in e
    ]
    assert len(progress) >= 2
    assert progress[-1]["processed"] == progress[-1]["total"]
    upstreams.llama.reset_cache()
    plain = httpx.post(
        gateway.url + "/v1/chat/completions",
        timeout=10,
        json={"model": "local", "messages": long_prompt, "stream": True},
    )
    assert not any("prompt_progress" in e for e in parse_sse(plain.content) if isinstance(e, dict))
    # the gateway asks for progress anyway, to meter the prompt before usage arrives
    assert upstreams.llama.requests.last.body["return_progress"] is True


def test_caller_disconnect_is_recorded(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.llama.queue(Reply(content="word " * 200, chunk_delay_ms=20))
    with httpx.stream(
        "POST",
        gateway.url + "/v1/chat/completions",
        timeout=10,
        json={"model": "local", "messages": HELLO, "stream": True},
    ) as resp:
        first = next(resp.iter_raw())
        assert first.startswith(b"data: ")
    deadline = time.monotonic() + 5
    calls: list[dict[str, Any]] = []
    while not calls and time.monotonic() < deadline:
        calls = gateway.calls()
        time.sleep(0.05)
    assert calls[0]["status"] == "error" and calls[0]["http_status"] == 499
    assert calls[0]["error_code"] == "client_disconnected"


async def _malformed_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b"<html>upstream proxy error</html>"
    if scope["path"].endswith("/empty/chat/completions"):
        body = orjson.dumps({"id": "x", "object": "chat.completion", "choices": []})
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize(("prefix", "words"), [("/html", "not JSON"), ("/empty", "no choices")])
def test_malformed_200_is_502(start_gateway: GatewayFactory, prefix: str, words: str) -> None:
    with serve_in_thread(_malformed_app) as bad:
        gw = start_gateway({"bad": {"provider": "openai-compatible", "base_url": bad.url + prefix}})
        resp = httpx.post(
            gw.url + "/v1/chat/completions", timeout=10, json={"model": "bad", "messages": HELLO}
        )
        assert resp.status_code == 502
        err = resp.json()["error"]
        assert err["code"] == "malformed_response" and words in err["message"]
        assert gw.calls()[0]["error_code"] == "malformed_response"


EMOJI_ANSWER = "🌟 Hello, team!"


@pytest.mark.parametrize("progress", [False, True])
def test_answer_opening_with_a_held_token_still_opens_with_the_role(
    gateway: Gateway, upstreams: Upstreams, progress: bool
) -> None:
    # llama-server holds back a first token that is part of an emoji and then sends no
    # role chunk of its own: the role rode only on the progress chunks the gateway drops
    upstreams.llama.queue(Reply(content=EMOJI_ANSWER, reasoning_content=None))
    events = parse_sse(stream_raw(gateway, return_progress=progress).content)
    answer = [e for e in events if isinstance(e, dict) and "prompt_progress" not in e]
    roles = [e["choices"][0]["delta"].get("role") for e in answer if e["choices"]]
    if progress:
        # the caller asked for progress: those chunks carried the role, nothing is added
        assert "assistant" not in roles
        assert all(e["choices"][0]["delta"]["role"] == "assistant" for e in events[:1])
    else:
        assert roles[0] == "assistant" and roles.count("assistant") == 1
        assert len({(e["id"], e["created"]) for e in answer}) == 1


def test_sdk_stream_helper_reads_an_answer_opening_with_an_emoji(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    upstreams.llama.queue(Reply(content=EMOJI_ANSWER, reasoning_content=None))
    with gateway.client().chat.completions.stream(model="local", messages=HELLO) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.role == "assistant"
    assert final.choices[0].message.content == EMOJI_ANSWER
