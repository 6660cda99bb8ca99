"""Pin the fake upstreams' wire behaviour: llama-server's and OpenAI's, as the fakes' docstrings
list it (tests/integration/test_fake_parity.py holds the llama fake to the real server).

Every test talks HTTP to a fake served by `serve_in_thread`, with `http.client`, a raw
socket, `aiohttp` or the `openai` SDK, so what is pinned is what a gateway would see.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionUserMessageParam

from tests.fakes.common import (
    Reply,
    count_tokens,
    parse_sse,
    tokenize,
)
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.server import RunningServer, serve_in_thread

CHAT = "/v1/chat/completions"
SYSTEM = {"role": "system", "content": "You are terse."}


# --------------------------------------------------------------------------- helpers


@dataclass
class Resp:
    """A complete HTTP response."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)

    def events(self) -> list[Any]:
        return parse_sse(self.body)


@dataclass
class Upstream:
    """A fake plus its running server, with a blocking HTTP client."""

    fake: Any
    srv: RunningServer

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Resp:
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=10)
        try:
            data = None if body is None else orjson.dumps(body)
            hdrs = {"content-type": "application/json", **(headers or {})}
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            raw = resp.read()
            return Resp(resp.status, {k.lower(): v for k, v in resp.getheaders()}, raw)
        finally:
            conn.close()

    def post(self, body: Any, path: str = CHAT, **headers: str) -> Resp:
        return self.request("POST", path, body, headers)

    def chat(self, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        resp = self.post({"messages": messages, **extra})
        assert resp.status == 200, resp.body
        return dict(resp.json())


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def sdk_user(text: str) -> ChatCompletionUserMessageParam:
    return {"role": "user", "content": text}


def echo_assistant(response: dict[str, Any], keep_reasoning: bool) -> dict[str, Any]:
    """The assistant turn a client appends to its history after `response`."""
    message = response["choices"][0]["message"]
    turn = {"role": "assistant", "content": message["content"]}
    if keep_reasoning and message.get("reasoning_content"):
        turn["reasoning_content"] = message["reasoning_content"]
    return turn


def data_chunks(events: list[Any]) -> list[dict[str, Any]]:
    return [e for e in events if isinstance(e, dict)]


@pytest.fixture
def llama() -> Iterator[Upstream]:
    fake = FakeLlamaServer()
    with serve_in_thread(fake.app) as srv:
        yield Upstream(fake, srv)


@pytest.fixture
def oai() -> Iterator[Upstream]:
    fake = FakeOpenAI()
    with serve_in_thread(fake.app) as srv:
        yield Upstream(fake, srv)


OAI_AUTH = {"authorization": "Bearer sk-test-key"}


def oai_chat(up: Upstream, **body: Any) -> Resp:
    return up.post({"model": "gpt-5.1", **body}, **OAI_AUTH)


# --------------------------------------------------------------------------- server


def test_serve_in_thread_binds_loopback_and_stops() -> None:
    fake = FakeLlamaServer()
    srv = serve_in_thread(fake.app)
    try:
        assert srv.url == f"http://127.0.0.1:{srv.port}"
        assert srv.port > 0 and srv.running
    finally:
        srv.stop()
    assert not srv.running
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", srv.port), timeout=1):
        pass


def test_recorder_keeps_method_path_headers_and_body(llama: Upstream) -> None:
    llama.post({"messages": [user("hi")]}, **{"X-Custom": "Yes"})
    rec = llama.fake.requests.last
    assert (rec.method, rec.path) == ("POST", CHAT)
    assert rec.headers["x-custom"] == "Yes"
    assert rec.body == {"messages": [user("hi")]}


# --------------------------------------------------------------------------- llama: meta routes


def test_llama_props_fields_and_caps(llama: Upstream) -> None:
    llama.fake.vision = True
    llama.fake.supports_preserve_reasoning = False
    resp = llama.request("GET", "/props")
    assert resp.status == 200 and resp.headers["server"] == "llama.cpp"
    props = resp.json()
    assert set(props["default_generation_settings"]) == {"params", "n_ctx"}
    assert props["default_generation_settings"]["n_ctx"] == 4096
    assert "n_ctx" not in props
    assert props["total_slots"] == 1
    assert props["modalities"] == {"vision": True, "video": False, "audio": False}
    assert props["build_info"] == "b11434-fake" and props["is_sleeping"] is False
    for key in ("model_alias", "model_path", "chat_template", "bos_token", "eos_token"):
        assert isinstance(props[key], str)
    for key in ("endpoint_slots", "endpoint_props", "endpoint_metrics"):
        assert isinstance(props[key], bool)
    caps = props["chat_template_caps"]
    assert set(caps) == {
        "supports_string_content",
        "supports_typed_content",
        "supports_tools",
        "supports_tool_calls",
        "supports_parallel_tool_calls",
        "supports_system_role",
        "supports_preserve_reasoning",
        "supports_reasoning_effort",
        "supports_object_arguments",
    }
    assert caps["supports_preserve_reasoning"] is False and caps["supports_tools"] is True


def test_llama_props_disabled_is_404(llama: Upstream) -> None:
    llama.fake.props_enabled = False
    resp = llama.request("GET", "/props")
    assert resp.status == 404
    assert resp.json() == {
        "error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}
    }


def test_llama_health_ok_then_503_while_loading(llama: Upstream) -> None:
    for path in ("/health", "/v1/health"):
        resp = llama.request("GET", path)
        assert (resp.status, resp.json()) == (200, {"status": "ok"})
    llama.fake.loading = True
    loading = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
    for method, path in (("GET", "/health"), ("GET", "/props"), ("POST", CHAT)):
        resp = llama.request(method, path, {"messages": [user("x")]} if method == "POST" else None)
        assert resp.status == 503 and resp.json() == loading
        assert resp.headers["connection"] == "close"
    llama.fake.loading = False
    assert llama.request("GET", "/health").status == 200


def test_llama_unknown_path_is_404(llama: Upstream) -> None:
    resp = llama.request("GET", "/nope")
    assert resp.status == 404
    assert resp.json()["error"] == {
        "code": 404,
        "message": "File Not Found",
        "type": "not_found_error",
    }
    assert llama.request("GET", CHAT).status == 404  # wrong method: no route


def test_llama_api_key(llama: Upstream) -> None:
    llama.fake.api_key = "secret"
    body = {"messages": [user("hi")]}
    resp = llama.post(body)
    assert resp.status == 401
    assert resp.json() == {
        "error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
    }
    assert llama.post(body, authorization="Bearer wrong").status == 401
    assert llama.post(body, authorization="Bearer secret").status == 200
    assert llama.post(body, **{"x-api-key": "secret"}).status == 200
    assert llama.request("GET", "/health").status == 200  # public


def test_llama_models_list(llama: Upstream) -> None:
    resp = llama.request("GET", "/v1/models")
    assert resp.status == 200
    assert [m["id"] for m in resp.json()["data"]] == ["fake-model"]


# --------------------------------------------------------------------------- llama: responses


def test_llama_non_stream_shape(llama: Upstream) -> None:
    llama.fake.queue(Reply(content="Hi there.", reasoning_content="Greet back."))
    resp = llama.post({"messages": [user("hello")], "model": "m1"})
    assert resp.status == 200 and resp.headers["server"] == "llama.cpp"
    body = resp.json()
    assert list(body) == [
        "choices",
        "created",
        "model",
        "system_fingerprint",
        "object",
        "usage",
        "id",
        "timings",
    ]
    assert body["object"] == "chat.completion" and body["model"] == "m1"
    assert body["id"].startswith("chatcmpl-")
    assert body["choices"] == [
        {
            "finish_reason": "stop",
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Hi there.",
                "reasoning_content": "Greet back.",
            },
        }
    ]
    usage = body["usage"]
    assert set(usage) == {
        "completion_tokens",
        "prompt_tokens",
        "total_tokens",
        "prompt_tokens_details",
    }
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert list(body["timings"]) == [
        "cache_n",
        "prompt_n",
        "prompt_ms",
        "prompt_per_token_ms",
        "prompt_per_second",
        "predicted_n",
        "predicted_ms",
        "predicted_per_token_ms",
        "predicted_per_second",
    ]


def test_llama_default_reply_and_empty_reasoning_omitted(llama: Upstream) -> None:
    body = llama.chat([user("one two three four five six seven")])
    message = body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "ok: one two three four five"}


def test_llama_timings_are_computed_from_counts(llama: Upstream) -> None:
    llama.fake.prompt_ms_per_token = 2.0
    llama.fake.predicted_ms_per_token = 25.0
    t = llama.chat([user("hello")])["timings"]
    assert t["prompt_ms"] == pytest.approx(2.0 * t["prompt_n"])
    assert t["prompt_per_second"] == pytest.approx(500.0)
    assert t["predicted_ms"] == pytest.approx(25.0 * t["predicted_n"])
    assert t["predicted_per_token_ms"] == pytest.approx(25.0)


def test_llama_tool_calls_non_stream(llama: Upstream) -> None:
    args = '{"city": "Paris"}'
    llama.fake.queue(Reply(content="", tool_calls=[{"name": "weather", "arguments": args}]))
    body = llama.chat([user("weather?")], tools=[_WEATHER_TOOL])
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == ""
    (call,) = choice["message"]["tool_calls"]
    assert list(call) == ["type", "function", "id"]
    assert call["function"] == {"name": "weather", "arguments": args}
    assert call["id"].startswith("call_")


_WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "weather", "parameters": {"type": "object"}},
}


def test_llama_max_tokens_cuts_with_length(llama: Upstream) -> None:
    llama.fake.queue(Reply(content="a b c d e f g h i j k l m n o p"))
    body = llama.chat([user("x")], max_tokens=5)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5


# --------------------------------------------------------------------------- llama: cache

_TURNS = [
    ("What is the capital of France?", "User asks a capital. Paris.", "Paris."),
    ("And its population?", "Population of Paris proper, about two million.", "About 2.1M."),
    ("Thanks!", "Say goodbye.", "You are welcome."),
]


def _queue_turns(fake: FakeLlamaServer) -> None:
    fake.queue(*(Reply(content=c, reasoning_content=r) for _, r, c in _TURNS))


def _tail(question: str) -> str:
    return f"<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def test_llama_cache_covers_prompt_and_reply_when_reasoning_is_sent_back(llama: Upstream) -> None:
    _queue_turns(llama.fake)
    messages = [SYSTEM, user(_TURNS[0][0])]
    first = llama.chat(messages)
    assert first["timings"]["cache_n"] == 0
    assert first["timings"]["prompt_n"] == first["usage"]["prompt_tokens"]
    previous = first
    for question, _, _ in _TURNS[1:]:
        messages += [echo_assistant(previous, keep_reasoning=True), user(question)]
        body = llama.chat(messages)
        before = previous["usage"]
        assert body["timings"]["cache_n"] == before["prompt_tokens"] + before["completion_tokens"]
        assert body["timings"]["prompt_n"] == count_tokens(_tail(question))
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == body["timings"]["cache_n"]
        previous = body


def test_llama_cache_stops_at_the_turn_whose_reasoning_was_dropped(llama: Upstream) -> None:
    _queue_turns(llama.fake)
    messages = [SYSTEM, user(_TURNS[0][0])]
    previous = llama.chat(messages)
    for question, _, _ in _TURNS[1:]:
        messages += [echo_assistant(previous, keep_reasoning=False), user(question)]
        body = llama.chat(messages)
        # The slot holds "<think>\n<reasoning>..." but the history renders an empty block:
        # the match ends right after "<think>\n" of the previous answer.
        expected = previous["usage"]["prompt_tokens"] + count_tokens("<think>\n")
        assert body["timings"]["cache_n"] == expected
        assert body["timings"]["prompt_n"] > previous["usage"]["completion_tokens"]
        previous = body
    assert "<think>\n\n</think>\n\nParis." in llama.fake.prompts[-1]


def test_llama_full_prompt_cached_still_evaluates_one_token(llama: Upstream) -> None:
    messages = [SYSTEM, user("same question")]
    first = llama.chat(messages)
    again = llama.chat(messages)
    n = first["usage"]["prompt_tokens"]
    assert again["timings"]["prompt_n"] == 1
    assert again["timings"]["cache_n"] == n - 1
    cold = llama.chat(messages, cache_prompt=False)
    assert cold["timings"]["cache_n"] == 0 and cold["timings"]["prompt_n"] == n


def test_llama_slot_choice_by_longest_prefix(llama: Upstream) -> None:
    llama.fake.total_slots = 2
    a = [SYSTEM, user("conversation A " * 20)]
    b = [user("conversation B " * 20)]
    llama.chat(a)  # slot 0
    llama.chat(b)  # too little in common with slot 0 (< 10 %): the unused slot 1
    assert llama.chat(a)["timings"]["cache_n"] > 40
    assert llama.chat(b)["timings"]["cache_n"] > 40
    forced = llama.chat(a, id_slot=3)  # 3 % 2 == 1, which holds B
    assert forced["timings"]["cache_n"] == count_tokens("<|im_start|>")


# --------------------------------------------------------------------------- llama: errors


def _prompt_tokens(text: str) -> int:
    return len(tokenize(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"))


@pytest.mark.parametrize("stream", [False, True])
def test_llama_context_overflow_body(llama: Upstream, stream: bool) -> None:
    llama.fake.n_ctx = 64
    text = "word " * 40
    n = _prompt_tokens(text)
    llama.fake.queue(Reply(content="unused"))
    resp = llama.post({"messages": [user(text)], "stream": stream})
    assert resp.status == 400
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json() == {
        "error": {
            "code": 400,
            "message": f"request ({n} tokens) exceeds the available context size (64 tokens), "
            "try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": n,
            "n_ctx": 64,
        }
    }
    assert len(llama.fake.replies) == 1  # a refused request does not consume the script


@pytest.mark.parametrize(
    ("extra", "status", "message"),
    [
        ({"tool_choice": "any"}, 400, "Invalid tool_choice: any"),
        (
            {"response_format": {"type": "xml"}},
            400,
            'response_format type must be one of "text" or "json_object", but got: xml',
        ),
        ({"n": 2}, 400, "Field 'n': Value must be between 1 <= value <= 1, but got 2"),
        ({"messages": None}, 400, "Expected 'messages' to be an array"),
        (
            {"chat_template_kwargs": {"enable_thinking": "yes"}},
            400,
            'invalid type for "enable_thinking" (expected boolean, got string)',
        ),
        ({"reasoning_format": "bogus"}, 500, "Unknown reasoning format: bogus"),
    ],
)
def test_llama_request_checks(
    llama: Upstream, extra: dict[str, Any], status: int, message: str
) -> None:
    resp = llama.post({"messages": [user("hi")], **extra})
    assert resp.status == status
    assert resp.json()["error"]["message"] == message
    assert resp.headers["connection"] == "close"


def test_llama_missing_messages_and_lenient_tool_choice(llama: Upstream) -> None:
    resp = llama.post({"model": "x"})
    assert resp.status == 400
    assert resp.json()["error"] == {
        "code": 400,
        "message": "'messages' is required",
        "type": "invalid_request_error",
    }
    named = {"type": "function", "function": {"name": "weather"}}
    assert llama.post({"messages": [user("hi")], "tool_choice": named}).status == 200


def test_llama_error_closes_the_connection(llama: Upstream) -> None:
    body = orjson.dumps({"messages": [user("hi")], "tool_choice": "bogus"})
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    # The timeout is below the 5 s keep-alive limit: the close must come from the error reply.
    with socket.create_connection(("127.0.0.1", llama.srv.port), timeout=2) as sock:
        sock.sendall(head + body)
        received = b""
        while chunk := sock.recv(65536):  # b"" only when the server closes its side
            received += chunk
    status_line, _, rest = received.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 400 Bad Request"
    assert b"\r\nconnection: close\r\n" in rest.lower()
    assert b"\r\nserver: llama.cpp\r\n" in rest.lower()


def test_llama_success_keeps_the_connection(llama: Upstream) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", llama.srv.port, timeout=5)
    try:
        for _ in range(2):
            conn.request("GET", "/health")
            resp = conn.getresponse()
            resp.read()
            assert resp.getheader("keep-alive") == "timeout=5, max=100"
            sock = conn.sock
        conn.request("GET", "/health")
        conn.getresponse().read()
        assert conn.sock is sock  # same socket reused: the server kept it open
    finally:
        conn.close()


def test_llama_scripted_error_with_headers(llama: Upstream) -> None:
    llama.fake.queue(Reply(status=500, headers={"retry-after": "2"}))
    resp = llama.post({"messages": [user("hi")]})
    assert resp.status == 500 and resp.headers["retry-after"] == "2"
    assert resp.json()["error"]["type"] == "server_error"
    assert llama.post({"messages": [user("hi")]}).status == 200


# --------------------------------------------------------------------------- llama: streaming


def _long_system() -> dict[str, Any]:
    return {"role": "system", "content": " ".join(f"rule{i}" for i in range(100))}


def test_llama_stream_order_with_progress(llama: Upstream) -> None:
    llama.fake.queue(Reply(content="Fine answer.", reasoning_content="Let me think."))
    resp = llama.post(
        {"messages": [_long_system(), user("go")], "stream": True, "return_progress": True}
    )
    assert resp.status == 200 and resp.headers["content-type"] == "text/event-stream"
    events = resp.events()
    assert events[-1] == "[DONE]"
    chunks = data_chunks(events)
    progress = [c for c in chunks if "prompt_progress" in c]
    assert chunks[: len(progress)] == progress  # progress comes first
    points = [p["prompt_progress"] for p in progress]
    total = points[0]["total"]
    assert points[0]["processed"] == points[0]["cache"] == 0 and points[0]["time_ms"] == 0
    assert points[-1]["processed"] == total and len(points) == 2 + (total - 1) // 64
    assert [p["processed"] for p in points] == sorted(p["processed"] for p in points)
    rest = chunks[len(progress) :]
    for c in progress + rest[:1]:
        assert c["choices"][0]["delta"] == {"role": "assistant", "content": None}
    kinds = [next(iter(c["choices"][0]["delta"]), "") for c in rest[1:-1]]
    assert kinds == sorted(kinds, key=["reasoning_content", "content"].index)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in rest[1:-1])
    thought = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in rest[1:-1])
    assert (text, thought) == ("Fine answer.", "Let me think.")
    assert rest[-1]["choices"] == [{"finish_reason": "stop", "index": 0, "delta": {}}]
    assert [("timings" in c) for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert {(c["id"], c["created"], c["model"], c["object"]) for c in chunks} == {
        (chunks[0]["id"], chunks[0]["created"], "fake-model", "chat.completion.chunk")
    }
    assert list(chunks[0])[:6] == [
        "choices",
        "created",
        "id",
        "model",
        "system_fingerprint",
        "object",
    ]


def test_llama_progress_starts_at_cached_tokens(llama: Upstream) -> None:
    messages = [_long_system(), user("go")]
    first = llama.chat(messages)
    messages += [echo_assistant(first, keep_reasoning=True), user("more")]
    events = llama.post({"messages": messages, "stream": True, "return_progress": True}).events()
    progress = [c["prompt_progress"] for c in data_chunks(events) if "prompt_progress" in c]
    cached = first["usage"]["total_tokens"]
    assert progress[0] == {
        "total": progress[0]["total"],
        "cache": cached,
        "processed": cached,
        "time_ms": 0,
    }
    assert progress[-1]["processed"] == progress[-1]["total"]


def test_llama_usage_chunk_only_with_include_usage(llama: Upstream) -> None:
    plain = data_chunks(llama.post({"messages": [user("a")], "stream": True}).events())
    assert all("usage" not in c for c in plain)
    assert "timings" in plain[-1] and plain[-1]["choices"][0]["finish_reason"] == "stop"
    body = {"messages": [user("a")], "stream": True, "stream_options": {"include_usage": True}}
    chunks = data_chunks(llama.post(body).events())
    last = chunks[-1]
    assert last["choices"] == [] and "timings" in last
    assert set(last["usage"]) == {
        "completion_tokens",
        "prompt_tokens",
        "total_tokens",
        "prompt_tokens_details",
    }
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and "timings" not in chunks[-2]


def _reassemble_tool_calls(chunks: list[dict[str, Any]]) -> dict[int, dict[str, str]]:
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            for frag in choice["delta"].get("tool_calls") or []:
                call = calls.setdefault(frag["index"], {"id": "", "name": "", "arguments": ""})
                call["id"] += frag.get("id") or ""
                call["name"] += frag.get("function", {}).get("name") or ""
                call["arguments"] += frag.get("function", {}).get("arguments") or ""
    return calls


_CALLS = [
    {"name": "weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
    {"name": "time", "arguments": '{"tz": "Europe/Paris"}'},
]


def test_llama_stream_tool_call_fragments_reassemble(llama: Upstream) -> None:
    llama.fake.queue(Reply(content="", tool_calls=_CALLS))
    events = llama.post(
        {"messages": [user("x")], "stream": True, "tools": [_WEATHER_TOOL]}
    ).events()
    chunks = data_chunks(events)
    calls = _reassemble_tool_calls(chunks)
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c["name"], c["arguments"]) for c in _CALLS
    ]
    heads = [
        frag
        for chunk in chunks
        for choice in chunk["choices"]
        for frag in choice["delta"].get("tool_calls", [])
        if "id" in frag
    ]
    assert [h["function"]["arguments"] for h in heads] == ["", ""]
    assert all(h["type"] == "function" and h["id"].startswith("call_") for h in heads)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_llama_break_after_chunks_drops_the_connection(llama: Upstream) -> None:
    llama.fake.queue(Reply(content="a b c d e f", break_after_chunks=3))
    conn = http.client.HTTPConnection("127.0.0.1", llama.srv.port, timeout=5)
    try:
        conn.request("POST", CHAT, orjson.dumps({"messages": [user("x")], "stream": True}))
        resp = conn.getresponse()
        assert resp.status == 200
        with pytest.raises(http.client.IncompleteRead) as info:
            resp.read()
    finally:
        conn.close()
    events = parse_sse(info.value.partial)
    assert len(events) == 3 and "[DONE]" not in events
    assert all(c["choices"][0]["finish_reason"] is None for c in events)


def test_llama_error_event_ends_stream_without_done(llama: Upstream) -> None:
    error = {"code": 500, "message": "boom", "type": "server_error"}
    llama.fake.queue(Reply(content="a b c", error_event_after_chunks=2, error_event=error))
    events = llama.post({"messages": [user("x")], "stream": True}).events()
    assert len(events) == 3 and events[-1] == {"error": error}


async def test_llama_stream_is_sent_chunk_by_chunk(llama: Upstream) -> None:
    llama.fake.queue(Reply(content="one two three", chunk_delay_ms=120))
    arrivals: list[float] = []
    url = f"{llama.srv.url}{CHAT}"
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json={"messages": [user("x")], "stream": True}) as resp,
    ):
        async for line in resp.content:
            if line.startswith(b"data:"):
                arrivals.append(time.monotonic())
    # 7 events with 6 gaps of 120 ms: buffering would make them arrive together.
    assert len(arrivals) == 8
    assert arrivals[-1] - arrivals[0] >= 0.5


async def _timed_pair(url: str) -> float:
    body = {"messages": [user("x")]}
    start = time.monotonic()
    async with aiohttp.ClientSession() as session:

        async def one() -> int:
            async with session.post(url, json=body) as resp:
                await resp.read()
                return resp.status

        assert list(await asyncio.gather(one(), one())) == [200, 200]
    return time.monotonic() - start


async def test_llama_busy_slots_queue_instead_of_failing(llama: Upstream) -> None:
    url = f"{llama.srv.url}{CHAT}"
    llama.fake.queue(Reply(delay_ms=400), Reply(delay_ms=400))
    assert await _timed_pair(url) >= 0.8  # one slot: the second request waited its turn
    llama.fake.total_slots = 2
    llama.fake.queue(Reply(delay_ms=400), Reply(delay_ms=400))
    assert await _timed_pair(url) < 0.75  # two slots: served side by side


# --------------------------------------------------------------------------- llama: SDK


def test_llama_with_openai_sdk(llama: Upstream) -> None:
    llama.fake.queue(
        Reply(content="Hello from llama.", reasoning_content="Think."),
        Reply(content="Streamed hello.", reasoning_content="Think more."),
    )
    with openai.OpenAI(base_url=f"{llama.srv.url}/v1", api_key="none", max_retries=0) as client:
        done = client.chat.completions.create(model="m", messages=[sdk_user("hi")])
        assert done.choices[0].message.content == "Hello from llama."
        assert (done.choices[0].message.model_extra or {})["reasoning_content"] == "Think."
        assert done.usage is not None and done.usage.prompt_tokens_details is not None
        with client.chat.completions.create(
            model="m",
            messages=[sdk_user("hi")],
            stream=True,
            stream_options={"include_usage": True},
        ) as stream:
            chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    thought = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        for c in chunks
        if c.choices
    )
    assert (text, thought) == ("Streamed hello.", "Think more.")
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0


def test_llama_sdk_raises_on_error_event(llama: Upstream) -> None:
    llama.fake.queue(Reply(content="a b c", error_event_after_chunks=1))
    with openai.OpenAI(base_url=f"{llama.srv.url}/v1", api_key="none", max_retries=0) as client:
        stream = client.chat.completions.create(model="m", messages=[sdk_user("hi")], stream=True)
        with stream, pytest.raises(openai.APIError):
            list(stream)


# --------------------------------------------------------------------------- OpenAI fake


def test_openai_wrong_key_is_masked(oai: Upstream) -> None:
    key = "sk-wrong-secret-1234"
    resp = oai.post({"model": "gpt-5.1", "messages": [user("x")]}, authorization=f"Bearer {key}")
    assert resp.status == 401
    masked = "sk-" + "*" * (len(key) - 7) + "1234"
    assert resp.json() == {
        "error": {
            "message": f"Incorrect API key provided: {masked}. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert key not in resp.body.decode()
    missing = oai.post({"model": "gpt-5.1", "messages": [user("x")]})
    assert (
        missing.status == 401 and "didn't provide an API key" in missing.json()["error"]["message"]
    )


def test_openai_unknown_param_and_model(oai: Upstream) -> None:
    resp = oai_chat(oai, messages=[user("x")], cache_prompt=True)
    assert resp.status == 400
    assert resp.json() == {
        "error": {
            "message": "Unrecognized request argument supplied: cache_prompt",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
    resp = oai.post({"model": "gpt-9", "messages": [user("x")]}, **OAI_AUTH)
    assert resp.status == 404
    assert resp.json()["error"] == {
        "message": "The model `gpt-9` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": None,
        "code": "model_not_found",
    }
    oai.fake.reject_unknown_params = False
    assert oai_chat(oai, messages=[user("x")], cache_prompt=True).status == 200


def test_openai_context_overflow(oai: Upstream) -> None:
    oai.fake.context_window = 50
    resp = oai_chat(oai, messages=[user("word " * 40)])
    assert resp.status == 400
    error = resp.json()["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "messages",
        "context_length_exceeded",
    )
    assert error["message"].startswith("This model's maximum context length is 50 tokens.")


def test_openai_non_stream_usage_and_reasoning_tokens(oai: Upstream) -> None:
    oai.fake.queue(Reply(content="Answer.", reasoning_content="hidden chain of thought"))
    body = oai_chat(oai, messages=[user("q")]).json()
    message = body["choices"][0]["message"]
    assert message["content"] == "Answer." and "reasoning_content" not in message
    usage = body["usage"]
    assert usage["completion_tokens_details"] == {
        "reasoning_tokens": count_tokens("hidden chain of thought"),
        "audio_tokens": 0,
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
    }
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0, "audio_tokens": 0}
    assert usage["completion_tokens"] == count_tokens("hidden chain of thought") + 2


def test_openai_prompt_cache_rule(oai: Upstream) -> None:
    long_history = [user("token " * 700)]
    first = oai_chat(oai, messages=long_history).json()["usage"]
    assert first["prompt_tokens"] > 1024 and first["prompt_tokens_details"]["cached_tokens"] == 0
    grown = [*long_history, {"role": "assistant", "content": "ok"}, user("next")]
    second = oai_chat(oai, messages=grown).json()["usage"]
    assert second["prompt_tokens_details"]["cached_tokens"] == first["prompt_tokens"] // 128 * 128
    short = [user("hi")]
    oai_chat(oai, messages=short)
    assert (
        oai_chat(oai, messages=short).json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    )


def test_openai_stream_with_include_usage(oai: Upstream) -> None:
    oai.fake.queue(Reply(content="Hi you."))
    resp = oai_chat(oai, messages=[user("q")], stream=True, stream_options={"include_usage": True})
    events = resp.events()
    assert events[-1] == "[DONE]"
    chunks = data_chunks(events)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[0]["choices"][0]["delta"]["content"] == ""
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert text == "Hi you."
    plain = data_chunks(oai_chat(oai, messages=[user("q")], stream=True).events())
    assert all("usage" not in c for c in plain)


def test_openai_stream_tool_call_fragments_reassemble(oai: Upstream) -> None:
    oai.fake.queue(Reply(content="", tool_calls=_CALLS))
    chunks = data_chunks(oai_chat(oai, messages=[user("q")], stream=True).events())
    calls = _reassemble_tool_calls(chunks)
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c["name"], c["arguments"]) for c in _CALLS
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_openai_scripted_429_with_retry_after(oai: Upstream) -> None:
    oai.fake.queue(Reply(status=429, headers={"retry-after": "1"}))
    resp = oai_chat(oai, messages=[user("q")])
    assert resp.status == 429 and resp.headers["retry-after"] == "1"
    assert resp.json()["error"]["code"] == "rate_limit_exceeded"


def test_openai_path_prefix_and_reasoning_rejection() -> None:
    fake = FakeOpenAI(path_prefix="/api/paas/v4", accepts_reasoning_content=False)
    with serve_in_thread(fake.app) as srv:
        up = Upstream(fake, srv)
        history = [user("q"), {"role": "assistant", "content": "a", "reasoning_content": "r"}]
        body = {"model": "gpt-5.1", "messages": history}
        assert up.post(body, "/v1/chat/completions", **OAI_AUTH).status == 404
        resp = up.post(body, "/api/paas/v4/chat/completions", **OAI_AUTH)
        assert resp.status == 400 and "reasoning_content" in resp.json()["error"]["message"]


def test_openai_with_sdk(oai: Upstream) -> None:
    oai.fake.queue(
        Reply(content="Non-stream."),
        Reply(content="", tool_calls=[_CALLS[0]]),
    )
    base = f"{oai.srv.url}/v1"
    with openai.OpenAI(base_url=base, api_key="sk-test-key", max_retries=0) as client:
        done = client.chat.completions.create(model="gpt-5.1", messages=[sdk_user("hi")])
        assert done.choices[0].message.content == "Non-stream."
        assert done.usage is not None and done.usage.completion_tokens_details is not None
        with client.chat.completions.create(
            model="gpt-5.1",
            messages=[sdk_user("hi")],
            stream=True,
            stream_options={"include_usage": True},
        ) as stream:
            chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    args = "".join(
        tc.function.arguments or "" for d in deltas for tc in d.tool_calls or [] if tc.function
    )
    assert args == _CALLS[0]["arguments"]
    assert chunks[-1].usage is not None and chunks[-1].choices == []


def test_openai_sdk_auth_error(oai: Upstream) -> None:
    with (
        openai.OpenAI(
            base_url=f"{oai.srv.url}/v1", api_key="sk-bad-key-0000", max_retries=0
        ) as client,
        pytest.raises(openai.AuthenticationError) as info,
    ):
        client.chat.completions.create(model="gpt-5.1", messages=[sdk_user("hi")])
    assert info.value.code == "invalid_api_key"
