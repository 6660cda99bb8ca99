"""Task and purpose from headers and paths, the other chat path, and health."""

from __future__ import annotations

from typing import Any

import httpx
import openai

from tests.e2e.conftest import Gateway, Upstreams

HELLO: list[Any] = [{"role": "user", "content": "hello"}]


def test_task_in_the_path(gateway: Gateway, upstreams: Upstreams) -> None:
    base = gateway.url + "/tasks/run-7.b/v1"
    with openai.OpenAI(base_url=base, api_key="x", max_retries=0) as client:
        client.chat.completions.create(model="local", messages=HELLO)
    assert gateway.calls()[0]["task"] == "run-7.b"


def test_headers_set_task_and_purpose(gateway: Gateway, upstreams: Upstreams) -> None:
    gateway.client(task="abc", purpose="verification").chat.completions.create(
        model="local", messages=HELLO
    )
    gateway.client(task="abc", purpose="my_custom_step").chat.completions.create(
        model="local", messages=HELLO
    )
    calls = gateway.calls()
    assert [(c["task"], c["purpose"]) for c in calls] == [
        ("abc", "verification"),
        ("abc", "my_custom_step"),
    ]
    # the gateway's own headers are not sent upstream
    assert "x-boundedcode-task" not in upstreams.llama.requests.last.headers


def test_plain_chat_path_and_defaults(gateway: Gateway, upstreams: Upstreams) -> None:
    resp = httpx.post(
        gateway.url + "/chat/completions", timeout=10, json={"model": "local", "messages": HELLO}
    )
    assert resp.status_code == 200 and resp.json()["choices"]
    call = gateway.calls()[0]
    assert (call["task"], call["purpose"]) == ("default", "agent_turn")


def test_health(gateway: Gateway) -> None:
    resp = httpx.get(gateway.url + "/health", timeout=10)
    assert resp.status_code == 200 and resp.json() == {"status": "ok"}
