"""Bodies an attacker sends: deep nesting, tool calls whose function is not an object, keys
that are not ASCII. Each is an OpenAI-shaped 400 naming the field (or an answer), recorded,
and the gateway keeps serving; a fault that escapes the routes is still an OpenAI-shaped 500."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from boundedcode_gateway.asgi.render import Receive, Send
from boundedcode_gateway.cli.calls import run_calls
from boundedcode_gateway.text import MAX_NAME_CHARS, clip
from tests.e2e.conftest import Gateway, GatewayFactory
from tests.fakes.canned import CannedUpstream, canned_answer

HELLO: list[Any] = [{"role": "user", "content": "hello"}]


@pytest.fixture
def http(gateway: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=20) as client:
        yield client


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def post_raw(http: httpx.Client, raw: bytes) -> httpx.Response:
    return http.post(
        "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )


def error_of(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/json"
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    return error  # type: ignore[no-any-return]


def still_serving(gateway: Gateway, http: httpx.Client) -> None:
    assert http.get("/health").json() == {"status": "ok"}
    reply = gateway.client().chat.completions.create(model="local", messages=HELLO)
    assert reply.choices[0].message.content


@pytest.mark.parametrize("model", ["local", "gpt"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("depth", [255, 300, 600, 1000])
@pytest.mark.parametrize(
    ("where", "param"),
    [
        ('"messages":[{"role":"user","content":"hi","x":%s}]', "messages[0].x[0]"),
        (
            '"messages":[{"role":"user","content":"hi"}],'
            '"tools":[{"type":"function","function":{"name":"f","parameters":%s}}]',
            "tools[0].function.parameters",
        ),
        ('"messages":[{"role":"user","content":"hi"}],"extra":%s', "extra[0][0][0]"),
    ],
    ids=["in-a-message", "in-a-tool", "in-an-extra-field"],
)
def test_deep_nesting_is_a_400_naming_the_field(
    gateway: Gateway,
    http: httpx.Client,
    model: str,
    stream: bool,
    depth: int,
    where: str,
    param: str,
) -> None:
    fields = where % nested(depth)
    raw = f'{{"model":"{model}","stream":{str(stream).lower()},{fields}}}'.encode()
    error = error_of(post_raw(http, raw), 400, "nested_too_deeply")
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    still_serving(gateway, http)
    refused = gateway.calls()[0]
    assert (refused["model_profile"], refused["http_status"], refused["error_code"]) == (
        model,
        400,
        "nested_too_deeply",
    )
    assert refused["attempts"] == 0  # nothing was sent upstream


def test_nesting_orjson_will_not_read_is_invalid_json(gateway: Gateway, http: httpx.Client) -> None:
    raw = f'{{"model":"local","messages":[{{"role":"user","content":"hi","x":{nested(1100)}}}]}}'
    error_of(post_raw(http, raw.encode()), 400, "invalid_json")
    still_serving(gateway, http)


def test_deep_nesting_through_the_sdk(gateway: Gateway) -> None:
    deep: Any = []
    for _ in range(299):
        deep = [deep]
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.client().chat.completions.create(
            model="gpt", messages=HELLO, extra_body={"extra": deep}
        )
    assert caught.value.code == "nested_too_deeply"
    assert caught.value.param == "extra[0][0][0]"


FUNCTION_NOT_AN_OBJECT = [
    (
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "a", "type": "function", "function": "x"}],
                },
                {"role": "tool", "tool_call_id": "a", "content": "r"},
            ]
        },
        "messages[1].tool_calls[0].function",
    ),
    (
        {
            "messages": HELLO,
            "tools": [{"type": "function", "function": {"name": "x"}}],
            "tool_choice": {"type": "function", "function": "x"},
        },
        "tool_choice.function",
    ),
    ({"messages": HELLO, "tools": [{"type": "function", "function": ["x"]}]}, "tools[0].function"),
]


@pytest.mark.parametrize("model", ["local", "other", "gpt", "glm"])
@pytest.mark.parametrize(("fields", "param"), FUNCTION_NOT_AN_OBJECT)
def test_a_function_that_is_not_an_object_is_a_400(
    gateway: Gateway, http: httpx.Client, model: str, fields: dict[str, Any], param: str
) -> None:
    resp = post_raw(http, orjson.dumps({"model": model, **fields}))
    error = error_of(resp, 400, "invalid_type")
    assert error["param"] == param
    still_serving(gateway, http)
    assert gateway.calls()[0]["http_status"] == 400


def test_a_function_that_is_not_an_object_through_the_sdk(gateway: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.client().chat.completions.create(
            model="gpt",
            messages=HELLO,
            # the SDK's own types would not let it through: as a caller that builds dicts
            extra_body={
                "tools": [{"type": "function", "function": {"name": "x"}}],
                "tool_choice": {"type": "function", "function": "x"},
            },
        )
    assert caught.value.param == "tool_choice.function"


@pytest.mark.parametrize("model", ["local", "gpt"])
def test_keys_that_are_not_ascii_are_answered(
    gateway: Gateway, http: httpx.Client, model: str
) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi", "é": "ü"}],
        "metadata": {"ключ": "値"},
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "parameters": {"type": "object", "properties": {"名前": {"type": "string"}}},
                },
            }
        ],
    }
    resp = post_raw(http, orjson.dumps(body))
    assert resp.status_code == 200, resp.text
    still_serving(gateway, http)


def test_a_fault_that_escapes_the_routes_is_an_openai_shaped_500(
    gateway: Gateway, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        raise RuntimeError("a bug outside the routes' own handling")

    monkeypatch.setattr(gateway.app, "router", broken)
    resp = http.get("/health")
    error = error_of(resp, 500, "internal_error")
    assert "a bug" not in error["message"]
    assert "GET /health" in error["message"]


def test_health_is_answered_while_a_huge_body_parses(gateway: Gateway, http: httpx.Client) -> None:
    """32 MiB of empty arrays: some 25 times that in memory once parsed, and a second or more
    of parsing that used to hold the loop the whole time."""
    head = b'{"model":"missing","messages":[{"role":"user","content":"hi"}],"x":['
    count = (32 * 1024 * 1024 - 1024 - len(head)) // 3
    raw = head + b"[]," * (count - 1) + b"[]]}"
    answered: list[float] = []  # when each /health answer arrived
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=gateway.url, timeout=30) as client:
            while not done.is_set():
                assert client.get("/health").status_code == 200
                answered.append(time.monotonic())
                time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        started = time.monotonic()
        resp = post_raw(http, raw)
        ended = time.monotonic()
    finally:
        done.set()
        poller.join(30)
    error_of(resp, 404, "model_not_found")
    during = [t for t in answered if started < t < ended]
    # what parsing it on the loop would hold the loop for, measured here and now
    parsing = time.monotonic()
    orjson.loads(raw)
    parsing = time.monotonic() - parsing
    # the loop answered while the body was parsed; it still waits while the objects are built
    # (with the GIL) and freed (when the call ends), a fraction of the parse
    assert len(during) >= 3, (len(during), ended - started)
    gaps = [b - a for a, b in zip([started, *during], [*during, ended], strict=True)]
    assert max(gaps) < parsing * 0.5, (max(gaps), parsing)
    assert gateway.calls()[0]["model_profile"] == "missing"


def test_a_model_name_is_clipped_where_it_is_kept_and_echoed(
    gateway: Gateway, http: httpx.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = "\x1b]0;owned\x07\x1b[2J" + "A" * 100_000
    with pytest.raises(openai.NotFoundError) as caught:
        gateway.client().chat.completions.create(model=hostile, messages=HELLO)
    assert len(caught.value.message) < 500
    refused = post_raw(http, orjson.dumps({"model": hostile, "messages": "not a list"}))
    error_of(refused, 400, "invalid_type")
    for call in gateway.calls():
        assert call["model_profile"] == clip(hostile)
        assert len(call["model_profile"]) == MAX_NAME_CHARS + 1
    rows = gateway.ledger_rows()
    assert [r["model_profile"] for r in rows] == [clip(hostile)] * 2
    assert run_calls(gateway.data_dir / "ledger.db", gateway.data_dir / "calls.jsonl", None, 5) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\x07" not in shown
    assert "\\x1b]0;owned" in shown


def test_an_upstreams_own_words_are_clipped(
    start_gateway: GatewayFactory, canned: CannedUpstream
) -> None:
    canned.answers.append(canned_answer(model="g" * 5000, finish_reason="f" * 5000))
    gateway = start_gateway(canned.profiles())
    gateway.client().chat.completions.create(model="canned", messages=HELLO)
    call = gateway.calls()[0]
    assert call["upstream_model"] == "g" * MAX_NAME_CHARS + "…"
    assert call["finish_reason"] == "f" * MAX_NAME_CHARS + "…"
