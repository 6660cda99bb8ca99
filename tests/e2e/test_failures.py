"""The rows of docs/failures.md that are not the same for every provider kind.

Breaks, cut bodies, error events, resent statuses and timeouts are one contract over all six
kinds (test_contract.py); here are the discard event's request forms, the transport's
keep-alive race and refused connections, llama.cpp's 500s, tool-call repair, context
overflow, and the waits and limits of the retry budget.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import openai
import orjson
import pytest

from boundedcode_gateway.policy.retry import BACKOFF_BASE_S
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.e2e.test_sdk_each_kind import KINDS, Kind, fake_of
from tests.fakes.common import Reply, parse_sse
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import serve_in_thread
from tests.outcomes import outcomes

HELLO: list[Any] = [{"role": "user", "content": "hello there"}]
ANSWER = "one two three four five six seven eight"


@pytest.fixture(params=KINDS, ids=[k.profile for k in KINDS])
def kind(request: pytest.FixtureRequest) -> Kind:
    return request.param  # type: ignore[no-any-return]


# llama.cpp goes on with a text answer that broke instead (test_continuation.py)
RESENDING = [k for k in KINDS if k.profile != "local"]


@pytest.fixture(params=RESENDING, ids=[k.profile for k in RESENDING])
def resending_kind(request: pytest.FixtureRequest) -> Kind:
    return request.param  # type: ignore[no-any-return]


def chat(
    gw: Gateway, model: str, stream: bool, headers: dict[str, str] | None = None, **extra: Any
) -> httpx.Response:
    body = {"model": model, "messages": HELLO, "stream": stream, **extra}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def content_of(events: list[Any]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or ""
        for e in events
        if isinstance(e, dict) and e.get("choices")
    )


# -- the discard event: declared in the body, or refused


def test_the_discard_option_in_the_body_is_kept_from_the_upstream(
    gateway: Gateway, upstreams: Upstreams, resending_kind: Kind
) -> None:
    fake = fake_of(upstreams, resending_kind)
    fake.queue(Reply(content=ANSWER, break_after_chunks=4), Reply(content=ANSWER))
    resp = chat(
        gateway, resending_kind.profile, stream=True, stream_options={"boundedcode_discard": True}
    )
    events = parse_sse(resp.content)
    assert events[-1] == "[DONE]" and content_of(events).endswith(ANSWER)
    assert any(isinstance(e, dict) and "boundedcode" in e for e in events)
    sent = [r.body for r in fake.requests if r.method == "POST"]
    assert len(sent) == 2
    assert all(b["stream_options"] == {"include_usage": True} for b in sent)


@pytest.mark.parametrize("value", ["yes", "2"])
def test_a_bad_discard_header_is_a_400(gateway: Gateway, value: str) -> None:
    resp = chat(gateway, "gpt", stream=True, headers={"X-BoundedCode-Stream-Discard": value})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "X-BoundedCode-Stream-Discard"


def test_a_discard_option_that_is_not_a_boolean_is_a_400(gateway: Gateway) -> None:
    resp = chat(gateway, "gpt", stream=True, stream_options={"boundedcode_discard": "yes"})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "stream_options.boundedcode_discard"


def test_a_non_streamed_call_with_the_discard_option_goes_upstream_without_it(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    upstreams.openai.queue(Reply(content=ANSWER, cut_body=True), Reply(content=ANSWER))
    resp = chat(gateway, "gpt", stream=False, stream_options={"boundedcode_discard": True})
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["message"]["content"] == ANSWER
    assert all("stream_options" not in r.body for r in upstreams.openai.requests)


# -- row 3: the keep-alive race, refused connections


class ClosingServer:
    """Answers each request, but drops a kept-alive connection when a second request
    arrives on it, before any response byte (what llama-server's 5 s idle close does)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str]] = []  # (connection number, idempotency key)
        self.writers: list[asyncio.StreamWriter] = []
        self._connections = 0
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        try:
            await self._serve(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        number = self._connections
        served = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            headers = dict(
                line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line
            )
            headers = {k.lower(): v for k, v in headers.items()}
            await reader.readexactly(int(headers.get("content-length", "0")))
            self.seen.append((number, headers.get("idempotency-key", "")))
            if served:
                writer.close()
                return
            body = orjson.dumps(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "m",
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "hi"},
                        }
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                }
            )
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Keep-Alive: timeout=5, max=100\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            await writer.drain()
            served += 1

    def start(self) -> None:
        self.thread.start()
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop
        )
        self.server = future.result(5)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()
        await asyncio.sleep(0)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(5)
        for task in asyncio.all_tasks(self.loop):
            self.loop.call_soon_threadsafe(task.cancel)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def test_request_on_a_dropped_kept_alive_connection_is_resent(
    start_gateway: GatewayFactory,
) -> None:
    server = ClosingServer()
    server.start()
    try:
        gw = start_gateway(
            {"other": {"provider": "local", "external_url": f"http://127.0.0.1:{server.port}"}}
        )
        client = gw.client()
        for _ in range(5):
            reply = client.chat.completions.create(model="other", messages=HELLO)
            assert reply.choices[0].message.content == "hi"
    finally:
        server.stop()
    chats = [s for s in server.seen if s[1]]
    keys = [k for _, k in chats]
    # every call after the first met a dropped connection and went again, same key,
    # on a new connection
    assert len(set(keys)) == 5
    for key in set(keys[1:]):
        conns = [c for c, k in chats if k == key]
        assert len(conns) == 2 and conns[0] != conns[1]
    assert all(c["status"] == "ok" for c in gw.calls())


def test_refused_connection_is_retried_until_the_server_is_up(
    start_gateway: GatewayFactory,
) -> None:
    fake = FakeLlamaServer()
    holder: dict[str, Any] = {}
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gw = start_gateway({"late": {"provider": "local", "external_url": f"http://127.0.0.1:{port}"}})

    def bring_up() -> None:
        time.sleep(0.6)
        import uvicorn

        config = uvicorn.Config(
            fake.app,
            host="127.0.0.1",
            port=port,
            lifespan="off",
            log_level="warning",
            log_config=None,
            interface="asgi3",
        )
        holder["server"] = uvicorn.Server(config)
        holder["server"].run()

    thread = threading.Thread(target=bring_up, daemon=True)
    thread.start()
    try:
        reply = gw.client().chat.completions.create(model="late", messages=HELLO)
        assert reply.choices[0].message.content
        call = gw.calls()[0]
        assert call["attempts"] >= 2
        assert outcomes(call["attempt_log"])[0] == {"status": 503, "code": "upstream_unavailable"}
    finally:
        while "server" not in holder:
            time.sleep(0.05)
        holder["server"].should_exit = True
        thread.join(10)


# -- row 4: llama.cpp 500


LLAMA_500 = {
    "error": {
        "code": 500,
        "type": "server_error",
        "message": "Failed to parse tool call arguments as JSON: bad",
    }
}


def test_llama_500_three_times_reaches_the_caller(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.llama.queue(*[Reply(status=500, error_body=LLAMA_500)] * 3, Reply(content="late"))
    with pytest.raises(openai.InternalServerError) as info:
        gateway.client().chat.completions.create(model="local", messages=HELLO)
    assert "Failed to parse tool call arguments as JSON" in info.value.message
    call = gateway.calls()[0]
    assert call["attempts"] == 3 and call["http_status"] == 500


# -- row 6: tool calls without id, type or arguments


async def _sloppy_tool_calls(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    message = await receive()
    stream = orjson.loads(message["body"]).get("stream")
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    if not stream:
        body = orjson.dumps(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {"function": {"name": "list_files"}},
                                {
                                    "id": "call_given",
                                    "type": "function",
                                    "function": {"name": "read", "arguments": '{"p":1}'},
                                },
                            ],
                        },
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
            }
        )
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return
    deltas = [
        {"role": "assistant", "tool_calls": [{"index": 0, "function": {"name": "list_files"}}]},
        {"tool_calls": [{"index": 1, "function": {"name": "read", "arguments": ""}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": '{"p":1}'}}]},
    ]
    events = [
        {**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas
    ]
    events.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    payload = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    await send({"type": "http.response.body", "body": payload + b"data: [DONE]\n\n"})


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_get_id_type_and_arguments(start_gateway: GatewayFactory, stream: bool) -> None:
    with serve_in_thread(_sloppy_tool_calls) as sloppy:
        gw = start_gateway(
            {"sloppy": {"provider": "openai-compatible", "base_url": sloppy.url + "/v1"}}
        )
        client = gw.client()
        if stream:
            calls: dict[int, dict[str, str]] = {}
            for c in client.chat.completions.create(model="sloppy", messages=HELLO, stream=True):
                for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
                    slot = calls.setdefault(tc.index, {"id": "", "type": "", "args": ""})
                    slot["id"] += tc.id or ""
                    slot["type"] += tc.type or ""
                    slot["args"] += (tc.function.arguments or "") if tc.function else ""
            got = [calls[0], calls[1]]
        else:
            reply = client.chat.completions.create(model="sloppy", messages=HELLO)
            got = [
                {"id": t.id, "type": t.type, "args": t.function.arguments}  # type: ignore[union-attr]
                for t in reply.choices[0].message.tool_calls or []
            ]
    assert got[0]["id"].startswith("call_") and len(got[0]["id"]) > 10
    assert got[0]["type"] == "function" and got[0]["args"] == "{}"
    assert got[1] == {"id": "call_given", "type": "function", "args": '{"p":1}'} or (
        stream and got[1]["id"].startswith("call_") and got[1]["args"] == '{"p":1}'
    )


# -- row 7: context overflow in any provider's words


def test_overflow_from_each_kind_is_context_length_exceeded(
    upstreams: Upstreams, start_gateway: GatewayFactory, kind: Kind
) -> None:
    upstreams.llama.n_ctx = 16
    upstreams.other_local.n_ctx = 16
    upstreams.openai.context_window = 16
    upstreams.compat.context_window = 16
    gw = start_gateway(upstreams.profiles)
    long = [{"role": "user", "content": "word " * 50}]
    with pytest.raises(openai.BadRequestError) as info:
        gw.client().chat.completions.create(model=kind.profile, messages=long)  # type: ignore[arg-type]
    assert info.value.code == "context_length_exceeded"
    assert info.value.param == "messages"
    assert any(ch.isdigit() for ch in info.value.message)  # the upstream's token counts kept
    call = gw.calls()[0]
    assert call["attempts"] == 1 and call["error_code"] == "context_length_exceeded"


# -- row 8: cloud rate limits and overload


@pytest.mark.parametrize(
    "retry_after",
    [{"retry-after": "1"}, {"retry-after-ms": "1000"}],
    ids=["seconds", "ms"],
)
def test_429_waits_for_retry_after(
    gateway: Gateway, upstreams: Upstreams, retry_after: dict[str, str]
) -> None:
    upstreams.openai.queue(Reply(status=429, headers=retry_after), Reply(content="later"))
    reply = gateway.client().chat.completions.create(model="gpt", messages=HELLO)
    assert reply.choices[0].message.content == "later"
    first, second = upstreams.openai.requests
    gap = second.received - first.received
    # the wait asked for, not the backoff (at most BACKOFF_BASE_S after a first attempt) ...
    assert gap >= 1.0, gap
    # ... and not the wait plus a backoff (at least 0.75 * BACKOFF_BASE_S)
    assert gap < 1.0 + 0.75 * BACKOFF_BASE_S, gap
    assert gateway.calls()[0]["attempt_log"][0]["status"] == 429


def test_429_with_an_http_date(gateway: Gateway, upstreams: Upstreams) -> None:
    from datetime import UTC, datetime, timedelta
    from email.utils import format_datetime

    # HTTP dates have whole seconds: this one is between 1 and 2 s away
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=2), usegmt=True)
    upstreams.compat.queue(Reply(status=429, headers={"retry-after": when}), Reply(content="ok"))
    started = time.monotonic()
    gateway.client().chat.completions.create(model="glm", messages=HELLO)
    assert time.monotonic() - started >= 0.9


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_other_4xx_are_never_retried(gateway: Gateway, upstreams: Upstreams, status: int) -> None:
    upstreams.openai.queue(Reply(status=status), Reply(content="never"))
    resp = chat(gateway, "gpt", stream=False)
    assert resp.status_code == status
    assert gateway.calls()[0]["attempts"] == 1


def test_used_up_quota_is_not_retried(gateway: Gateway, upstreams: Upstreams) -> None:
    quota = {
        "error": {
            "message": "You exceeded your current quota, please check your plan "
            "and billing details.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
    upstreams.openai.queue(Reply(status=429, error_body=quota), Reply(content="never"))
    resp = chat(gateway, "gpt", stream=False)
    assert resp.status_code == 429 and resp.json()["error"]["code"] == "insufficient_quota"
    assert gateway.calls()[0]["attempts"] == 1


def test_budget_caps_attempts(upstreams: Upstreams, start_gateway: GatewayFactory) -> None:
    profiles = {
        **upstreams.profiles,
        "gpt": {**upstreams.profiles["gpt"], "retry": {"max_attempts": 2}},
    }
    gw = start_gateway(profiles)
    upstreams.openai.queue(*[Reply(status=503, headers={"retry-after": "0"})] * 3)
    resp = chat(gw, "gpt", stream=False)
    assert resp.status_code == 503
    assert gw.calls()[0]["attempts"] == 2
