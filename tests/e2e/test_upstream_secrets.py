"""An upstream that echoes the API key it received, everywhere it can: its error's message,
type, code and param, its Retry-After, an error text long enough to be cut inside the key,
the model name and finish reason of an answer (whole and streamed), an error event after
content. The key must appear nowhere: not in what a caller (raw HTTP or the ``openai`` SDK)
gets, not in the call log, the ledger or any file the gateway wrote, not in its logs.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.e2e.conftest import GatewayFactory
from tests.fakes.hostile import (
    HostileUpstream,
    Play,
    Request,
    chunk,
    completion,
    json_play,
    openai_stream,
    sse,
    stream_head,
    whole,
)

KEY_ENV = "ECHOED_UPSTREAM_KEY"
# every fragment of it that could survive starts with this
KEY = "sk-ECHO-4f9a1c7e2b8d6053aa17c4e9"
HELLO: list[Any] = [{"role": "user", "content": "hello"}]
# the gateway cuts an error text that is not JSON at 500 characters: 16 of the key's
# characters fall before the cut
FILLER = "e" * (500 - 16)


def echo_text(req: Request) -> Play:
    body = f"{FILLER}{req.key} and more of the proxy's page".encode()
    return Play([whole(400, body, {"Content-Type": "text/html"})])


# -- what each kind of upstream echoes, in its own wire shape


def openai_error(req: Request) -> Play:
    k = req.key
    error = {"message": f"Incorrect API key provided: {k}", "type": k, "code": k, "param": k}
    return json_play(429, {"error": error}, {"Retry-After": k})


def openai_whole(req: Request) -> Play:
    return json_play(200, completion(f"your key is {req.key}", model=req.key, finish=req.key))


def openai_streamed(req: Request) -> Play:
    return openai_stream([f"your key is {req.key}"], model=req.key, finish=req.key)


def openai_error_event(req: Request) -> Play:
    k = req.key
    error = {"error": {"message": f"key {k}", "type": k, "code": k, "param": k}}
    shown = chunk({"role": "assistant", "content": "Hi"}, model=k)
    return Play([stream_head(), shown, sse(error)])


def anthropic_error(req: Request) -> Play:
    k = req.key
    error = {"type": k, "message": f"invalid x-api-key {k}", "details": {"error_code": k}}
    return json_play(429, {"type": "error", "error": error}, {"Retry-After": k})


def anthropic_message(k: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": k,
        "content": [{"type": "text", "text": f"your key is {k}"}],
        "stop_reason": k,
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }


def anthropic_whole(req: Request) -> Play:
    return json_play(200, anthropic_message(req.key))


def anthropic_event(name: str, obj: dict[str, Any]) -> bytes:
    return f"event: {name}\n".encode() + sse({"type": name, **obj})


def anthropic_opening(k: str, text: str) -> list[bytes]:
    """A message's start and its first text block's first words."""
    start = {**anthropic_message(k), "content": [], "stop_reason": None}
    return [
        anthropic_event("message_start", {"message": start}),
        anthropic_event(
            "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
        ),
        anthropic_event(
            "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}}
        ),
    ]


def anthropic_streamed(req: Request) -> Play:
    k = req.key
    events = [
        *anthropic_opening(k, f"your key is {k}"),
        anthropic_event("content_block_stop", {"index": 0}),
        anthropic_event(
            "message_delta", {"delta": {"stop_reason": k}, "usage": {"output_tokens": 2}}
        ),
        anthropic_event("message_stop", {}),
    ]
    return Play([stream_head(), *events])


def anthropic_error_event(req: Request) -> Play:
    k = req.key
    events = [
        *anthropic_opening(k, "Hi"),
        anthropic_event("error", {"error": {"type": k, "message": f"overloaded {k}"}}),
    ]
    return Play([stream_head(), *events])


def gemini_error(req: Request) -> Play:
    k = req.key
    error = {"code": 429, "message": f"API key {k} is over its quota", "status": k}
    return json_play(429, {"error": error}, {"Retry-After": k})


def gemini_answer(k: str, text: str, finish: str, **candidate: Any) -> dict[str, Any]:
    parts = [{"text": text}]
    return {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "finishReason": finish, **candidate}
        ],
        "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2},
        "modelVersion": k,
        "responseId": "resp-1",
    }


def gemini_whole(req: Request) -> Play:
    return json_play(200, gemini_answer(req.key, f"your key is {req.key}", req.key))


def gemini_streamed(req: Request) -> Play:
    k = req.key
    return Play([stream_head(), sse(gemini_answer(k, f"your key is {k}", k))])


def gemini_error_event(req: Request) -> Play:
    """Gemini's refusal of a function call, its message echoing the key."""
    k = req.key
    refused = gemini_answer(k, "", "MALFORMED_FUNCTION_CALL", finishMessage=f"bad call {k}")
    return Play([stream_head(), sse(gemini_answer(k, "Hi", "")), sse(refused)])


@dataclass(frozen=True)
class Kind:
    provider: str
    error: Callable[[Request], Play]
    whole: Callable[[Request], Play]
    streamed: Callable[[Request], Play]
    error_event: Callable[[Request], Play]

    def profile(self, upstream: HostileUpstream) -> dict[str, Any]:
        base = upstream.url + "/v1"
        return {
            "provider": self.provider,
            "model": "echo-model",
            "api_key_env": KEY_ENV,
            "base_url": base,
            "retry": {"max_attempts": 1},
        }


KINDS = [
    Kind("openai", openai_error, openai_whole, openai_streamed, openai_error_event),
    Kind("openai-compatible", openai_error, openai_whole, openai_streamed, openai_error_event),
    Kind("anthropic", anthropic_error, anthropic_whole, anthropic_streamed, anthropic_error_event),
    Kind("gemini", gemini_error, gemini_whole, gemini_streamed, gemini_error_event),
]


@pytest.fixture(params=KINDS, ids=[k.provider for k in KINDS])
def kind(request: pytest.FixtureRequest) -> Kind:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def echoing(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostileUpstream]:
    monkeypatch.setenv(KEY_ENV, KEY)
    upstream = HostileUpstream().start()
    yield upstream
    upstream.stop()


def assert_no_key(where: str, data: bytes | str) -> None:
    raw = data.encode() if isinstance(data, str) else data
    # in any case: an upstream's words may be folded to lower case on the way
    assert b"sk-echo" not in raw.lower(), f"the key (or part of it) is in {where}"


def raw_exchange(resp: httpx.Response) -> bytes:
    headers = "".join(f"{k}: {v}\n" for k, v in resp.headers.items())
    return f"{resp.status_code}\n{headers}\n".encode() + resp.content


def test_the_key_an_upstream_echoes_reaches_no_one(
    start_gateway: GatewayFactory,
    echoing: HostileUpstream,
    kind: Kind,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    gw = start_gateway({"echo": kind.profile(echoing)})
    scripts = [
        (kind.error, False),
        (echo_text, False),
        (kind.whole, False),
        (kind.streamed, True),
        (kind.error_event, True),
    ]
    echoing.queue(*(script for script, _ in scripts))
    answers = []
    for script, stream in scripts:
        body = {"model": "echo", "messages": HELLO, "stream": stream}
        resp = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30)
        answers.append(resp)
        assert_no_key(f"the answer to {script.__name__}", raw_exchange(resp))
    # every request carried the key, and every answer echoed it
    assert [r.key for r in echoing.requests] == [KEY] * len(scripts)
    first = answers[0]
    assert first.status_code == 429 and "retry-after" not in first.headers
    assert "***" in first.json()["error"]["message"]
    cut = answers[1].json()["error"]["message"]
    assert answers[1].status_code == 400 and len(cut) == 500 and f"{FILLER}***" in cut
    assert answers[2].status_code == 200 and answers[3].status_code == 200
    # the same through the SDK
    sdk_scripts = [kind.error, kind.whole, kind.streamed, kind.error_event]
    echoing.queue(*sdk_scripts)
    client = gw.client()
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="echo", messages=HELLO)
    assert_no_key(
        "the SDK's error", f"{refused.value} {refused.value.body} {refused.value.response}"
    )
    assert_no_key("the SDK's error headers", str(dict(refused.value.response.headers)))
    reply = client.chat.completions.create(model="echo", messages=HELLO)
    assert_no_key("the SDK's answer", reply.model_dump_json())
    parts = list(client.chat.completions.create(model="echo", messages=HELLO, stream=True))
    assert_no_key("the SDK's stream", orjson.dumps([p.model_dump() for p in parts]))
    with pytest.raises(openai.APIError) as broken:
        for part in client.chat.completions.create(model="echo", messages=HELLO, stream=True):
            assert_no_key("the SDK's stream", part.model_dump_json())
    assert_no_key("the SDK's in-stream error", f"{broken.value} {broken.value.body}")
    # nothing the gateway wrote holds it: call log, ledger, the tasks' reasoning
    records = gw.calls()
    assert len(records) == len(scripts) + len(sdk_scripts)
    assert gw.ledger_rows()
    written = [p for p in Path(gw.data_dir).rglob("*") if p.is_file()]
    assert any(p.name == "calls.jsonl" for p in written)
    assert any(p.name == "ledger.db" for p in written)
    for path in written:
        assert_no_key(str(path), path.read_bytes())
    # the lines of the failed calls, with the upstream's messages, are written by now
    assert gw.app.failures.flush()
    assert any(r.name == "boundedcode_gateway.calls" for r in caplog.records)
    assert_no_key("the gateway's log", caplog.text)
    for record in caplog.records:
        assert_no_key("a log record", f"{record.getMessage()} {record.exc_text or ''}")


def test_a_numeric_retry_after_is_relayed_as_whole_seconds(
    start_gateway: GatewayFactory, echoing: HostileUpstream
) -> None:
    error = {"error": {"message": "slow down", "type": "rate_limit_error", "code": None}}
    echoing.queue(
        json_play(429, error, {"Retry-After": "12.2"}),
        json_play(429, error, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}),
        json_play(429, error, {"Retry-After": "inf"}),
    )
    gw = start_gateway({"echo": KINDS[0].profile(echoing)})
    answers = [
        httpx.post(
            gw.url + "/v1/chat/completions", json={"model": "echo", "messages": HELLO}, timeout=30
        )
        for _ in range(3)
    ]
    assert [a.status_code for a in answers] == [429, 429, 429]
    # seconds, rounded up; a date in the past is 0; a value that is no number is dropped
    assert [a.headers.get("retry-after") for a in answers] == ["13", "0", None]


@pytest.mark.parametrize(
    "bad_key",
    ["sk-good\r\nX-Injected: 1", "sk-good\nX-Injected: 1", " sk-padded ", "sk-caf\u00e9"],
    ids=["crlf", "lf", "spaces-around", "non-ascii"],
)
def test_a_key_no_header_can_carry_is_refused_at_call_time(
    start_gateway: GatewayFactory,
    echoing: HostileUpstream,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    bad_key: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(KEY_ENV, bad_key)
    gw = start_gateway({"echo": KINDS[0].profile(echoing)})
    with pytest.raises(openai.InternalServerError) as info:
        gw.client().chat.completions.create(model="echo", messages=HELLO)
    error = info.value.body
    assert isinstance(error, dict)
    assert error["code"] == "invalid_api_key_config"
    assert KEY_ENV in error["message"]
    assert "sk-" not in error["message"]
    assert echoing.requests == []  # nothing was sent
    [record] = gw.calls()
    assert (record["http_status"], record["error_code"]) == (500, "invalid_api_key_config")
    assert "sk-" not in caplog.text
    for path in Path(gw.data_dir).rglob("*"):
        if path.is_file():
            assert b"sk-" not in path.read_bytes()


# -- a key written across deltas of text


def split_key(*at: int) -> list[str]:
    """The key cut at ``at``, the first piece after some text, the last before more."""
    bounds = [0, *at, len(KEY)]
    pieces = [KEY[a:b] for a, b in itertools.pairwise(bounds)]
    pieces[0] = "your key is " + pieces[0]
    pieces[-1] += ", keep it safe"
    return pieces


def split_stream(field: str, pieces: list[str]) -> Callable[[Request], Play]:
    def play(req: Request) -> Play:
        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({field: p}) for p in pieces]
        events += [chunk({}, "stop"), b"data: [DONE]\n\n"]
        return Play([stream_head(), *events])

    return play


def received_text(front: str, raw: bytes) -> str:
    """The text (and reasoning) a caller of ``front`` reads from its stream, joined."""
    parts: list[str] = []
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        obj = orjson.loads(line[6:])
        if front == "chat":
            delta = obj["choices"][0]["delta"] if obj.get("choices") else {}
            parts += [delta.get(k) or "" for k in ("reasoning_content", "content")]
        elif front == "messages" and obj.get("type") == "content_block_delta":
            parts += [obj["delta"].get(k) or "" for k in ("thinking", "text")]
        elif front == "responses" and str(obj.get("type", "")).endswith("text.delta"):
            parts.append(obj["delta"])
    return "".join(parts)


# each front: its path, its body (less the model and stream), its headers
FRONT_CALLS: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
    "chat": ("/v1/chat/completions", {"messages": HELLO}, {}),
    "messages": (
        "/v1/messages",
        {"messages": HELLO, "max_tokens": 100},
        {"anthropic-version": "2023-06-01"},
    ),
    "responses": ("/v1/responses", {"input": "hello"}, {}),
}
SPLITS = {
    "two-content-deltas": ("content", split_key(7)),
    "three-content-deltas": ("content", split_key(3, 20)),
    "a-delta-per-character": ("content", [*KEY]),
    "two-reasoning-deltas": ("reasoning_content", split_key(12)),
}


@pytest.mark.parametrize("front", list(FRONT_CALLS))
@pytest.mark.parametrize("split", list(SPLITS))
def test_a_key_written_across_stream_deltas_reaches_no_caller(
    start_gateway: GatewayFactory, echoing: HostileUpstream, front: str, split: str
) -> None:
    field, pieces = SPLITS[split]
    assert KEY in "".join(pieces) and all(KEY not in p for p in pieces)
    gw = start_gateway({"echo": KINDS[1].profile(echoing)})
    echoing.queue(split_stream(field, pieces))
    path, body, headers = FRONT_CALLS[front]
    resp = httpx.post(
        gw.url + path,
        json={"model": "echo", "stream": True, **body},
        headers=headers,
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    text = received_text(front, resp.content)
    assert KEY not in text
    assert "***" in text
    expected = "".join(pieces).replace(KEY, "***")
    assert text == expected
    assert_no_key("the stream", resp.content)
    (record,) = gw.calls()
    assert record["status"] == "ok"


def anthropic_split(req: Request) -> Play:
    pieces = split_key(9, 21)
    events = anthropic_opening("claude", pieces[0])
    events += [
        anthropic_event(
            "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": p}}
        )
        for p in pieces[1:]
    ]
    events += [
        anthropic_event("content_block_stop", {"index": 0}),
        anthropic_event(
            "message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}
        ),
        anthropic_event("message_stop", {}),
    ]
    return Play([stream_head(), *events])


def gemini_split(req: Request) -> Play:
    *pieces, last = split_key(9, 21)
    events = [sse(gemini_answer("gemini", p, "")) for p in pieces]
    return Play([stream_head(), *events, sse(gemini_answer("gemini", last, "STOP"))])


@pytest.mark.parametrize(
    ("provider", "script"),
    [("anthropic", anthropic_split), ("gemini", gemini_split)],
    ids=["anthropic", "gemini"],
)
def test_a_key_across_deltas_is_caught_for_every_provider_kind(
    start_gateway: GatewayFactory,
    echoing: HostileUpstream,
    provider: str,
    script: Callable[[Request], Play],
) -> None:
    kind = next(k for k in KINDS if k.provider == provider)
    gw = start_gateway({"echo": kind.profile(echoing)})
    echoing.queue(script)
    body = {"model": "echo", "messages": HELLO, "stream": True}
    resp = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 200, resp.text
    assert received_text("chat", resp.content) == "your key is ***, keep it safe"
    assert_no_key("the stream", resp.content)
