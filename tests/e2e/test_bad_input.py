"""Bad input: an OpenAI-shaped 4xx/5xx with the right status, the gateway keeps serving, and
the call is recorded wherever the body named a model."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.e2e.conftest import OPENAI_KEY, Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply

HELLO: list[Any] = [{"role": "user", "content": "hello"}]


@pytest.fixture
def http(gateway: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        yield client


def post(
    http: httpx.Client, body: Any, path: str = "/v1/chat/completions", **headers: str
) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return http.post(path, content=content, headers={"content-type": "application/json", **headers})


def error_of(resp: httpx.Response, status: int, code: str | None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    return body["error"]  # type: ignore[no-any-return]


def still_serving(gateway: Gateway, http: httpx.Client) -> None:
    assert http.get("/health").json() == {"status": "ok"}
    reply = gateway.client().chat.completions.create(model="local", messages=HELLO)
    assert reply.choices[0].message.content


def test_malformed_json(gateway: Gateway, http: httpx.Client) -> None:
    err = error_of(post(http, b'{"model": "local", "messages": ['), 400, "invalid_json")
    assert err["type"] == "invalid_request_error"
    assert err["message"].startswith("We could not parse the JSON body of your request")
    still_serving(gateway, http)
    assert [c["model_profile"] for c in gateway.calls()] == ["local"]  # only the good call


def test_body_not_an_object(gateway: Gateway, http: httpx.Client) -> None:
    error_of(post(http, [1, 2]), 400, "invalid_type")
    still_serving(gateway, http)


def test_missing_model(gateway: Gateway, http: httpx.Client) -> None:
    err = error_of(post(http, {"messages": HELLO}), 400, "missing_required_parameter")
    assert err["param"] == "model"
    assert err["message"] == "Missing required parameter: 'model'."
    still_serving(gateway, http)


def test_missing_messages_is_recorded(gateway: Gateway, http: httpx.Client) -> None:
    err = error_of(post(http, {"model": "gpt"}), 400, "missing_required_parameter")
    assert err["param"] == "messages"
    still_serving(gateway, http)
    bad = gateway.calls()[0]
    assert bad["model_profile"] == "gpt" and bad["status"] == "error"
    assert bad["http_status"] == 400 and bad["error_code"] == "missing_required_parameter"


# each refusal in OpenAI's own words, so a client's handling of OpenAI's 400s reads it
@pytest.mark.parametrize(
    ("body", "param", "expected"),
    [
        ({"model": "local", "messages": "hello"}, "messages", "an array, but got a string"),
        ({"model": 7, "messages": HELLO}, "model", "a string, but got an integer"),
        (
            {"model": "local", "messages": HELLO, "stream": "yes"},
            "stream",
            "a boolean, but got a string",
        ),
        (
            {"model": "local", "messages": HELLO, "max_tokens": "10"},
            "max_tokens",
            "an integer, but got a string",
        ),
        (
            {"model": "local", "messages": HELLO, "max_tokens": 1.5},
            "max_tokens",
            "an integer, but got a decimal number",
        ),
        (
            {"model": "local", "messages": HELLO, "temperature": "hot"},
            "temperature",
            "a decimal, but got a string",
        ),
        (
            {"model": "local", "messages": HELLO, "tools": {"name": "x"}},
            "tools",
            "an array, but got an object",
        ),
        (
            {"model": "local", "messages": [{"role": "user", "content": 5}]},
            "messages[0].content",
            "one of a string or array of objects, but got an integer",
        ),
        ({"model": "local", "messages": ["hello"]}, "messages[0]", "an object, but got a string"),
    ],
)
def test_wrong_types(
    gateway: Gateway, http: httpx.Client, body: Any, param: str, expected: str
) -> None:
    err = error_of(post(http, body), 400, "invalid_type")
    assert err["param"] == param
    assert err["message"] == f"Invalid type for '{param}': expected {expected} instead."
    still_serving(gateway, http)


def test_unknown_role(gateway: Gateway, http: httpx.Client) -> None:
    body = {"model": "local", "messages": [{"role": "wizard", "content": "x"}]}
    err = error_of(post(http, body), 400, "invalid_value")
    assert err["param"] == "messages[0].role"
    assert err["message"] == (
        "Invalid value: 'wizard'. Supported values are: 'system', 'assistant', 'user', "
        "'function', 'tool', and 'developer'."
    )


def test_empty_messages(gateway: Gateway, http: httpx.Client) -> None:
    err = error_of(post(http, {"model": "local", "messages": []}), 400, "empty_array")
    assert err["message"] == (
        "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an "
        "empty array instead."
    )


def test_unknown_model_is_404_and_recorded(gateway: Gateway, http: httpx.Client) -> None:
    err = error_of(post(http, {"model": "gpt-9", "messages": HELLO}), 404, "model_not_found")
    assert "gpt-9" in err["message"] and err["param"] == "model"
    still_serving(gateway, http)
    bad = gateway.calls()[0]
    assert bad["model_profile"] == "gpt-9" and bad["provider"] is None
    assert bad["http_status"] == 404 and bad["messages"] == 1


def test_body_over_the_limit(upstreams: Upstreams, start_gateway: GatewayFactory) -> None:
    gw = start_gateway(upstreams.profiles, max_body_mib=0.01)  # about 10 KiB
    big = {"model": "local", "messages": [{"role": "user", "content": "x" * 20_000}]}
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        err = error_of(post(http, big), 413, "request_too_large")
        assert "limit" in err["message"]
        # without a Content-Length the limit holds too
        chunked = http.post(
            "/v1/chat/completions",
            content=iter([orjson.dumps(big)]),
            headers={"content-type": "application/json"},
        )
        error_of(chunked, 413, "request_too_large")
        still_serving(gw, http)
    assert len(gw.calls()) == 1


@pytest.mark.parametrize("task", [b"../etc", b"a b", b"x" * 129, b"..", "ünicode".encode()])
def test_bad_task_header(gateway: Gateway, http: httpx.Client, task: bytes) -> None:
    resp = http.post(
        "/v1/chat/completions",
        json={"model": "local", "messages": HELLO},
        headers={b"X-BoundedCode-Task": task},
    )
    err = error_of(resp, 400, "invalid_task")
    assert err["param"] == "X-BoundedCode-Task"
    still_serving(gateway, http)
    assert gateway.calls()[0]["error_code"] == "invalid_task"


def test_bad_task_in_path(gateway: Gateway, http: httpx.Client) -> None:
    error_of(
        post(http, {"model": "local", "messages": HELLO}, path="/tasks/a%20b/v1/chat/completions"),
        400,
        "invalid_task",
    )


def test_task_header_and_path_disagree(gateway: Gateway, http: httpx.Client) -> None:
    resp = post(
        http,
        {"model": "local", "messages": HELLO},
        path="/tasks/one/v1/chat/completions",
        **{"X-BoundedCode-Task": "two"},
    )
    error_of(resp, 400, "invalid_task")


def test_bad_purpose(gateway: Gateway, http: httpx.Client) -> None:
    resp = post(http, {"model": "local", "messages": HELLO}, **{"X-BoundedCode-Purpose": "Plan!"})
    err = error_of(resp, 400, "invalid_purpose")
    assert err["param"] == "X-BoundedCode-Purpose"


def test_unknown_path_and_wrong_method(gateway: Gateway, http: httpx.Client) -> None:
    error_of(http.get("/v1/completions"), 404, "not_found")
    error_of(http.get("/v1/chat/completions"), 405, "method_not_allowed")
    error_of(http.get("/v1/models/nope"), 404, "model_not_found")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("stream", [False, True])
def test_dead_upstream_is_503_and_recorded(
    upstreams: Upstreams, start_gateway: GatewayFactory, stream: bool
) -> None:
    dead = {"provider": "local", "external_url": f"http://127.0.0.1:{free_port()}"}
    gw = start_gateway({**upstreams.profiles, "dead": dead})
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        resp = post(http, {"model": "dead", "messages": HELLO, "stream": stream})
        err = error_of(resp, 503, "upstream_unavailable")
        assert "connect" in err["message"]
        still_serving(gw, http)
    bad = gw.calls()[0]
    assert bad["model_profile"] == "dead" and bad["http_status"] == 503
    assert bad["error_code"] == "upstream_unavailable" and bad["stream"] is stream


def test_missing_key_names_the_variable(
    upstreams: Upstreams, start_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = start_gateway(upstreams.profiles)
    monkeypatch.delenv("TEST_OPENAI_KEY")
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        err = error_of(post(http, {"model": "gpt", "messages": HELLO}), 500, "missing_api_key")
    assert "TEST_OPENAI_KEY" in err["message"]
    assert upstreams.openai.requests == []


def test_upstream_auth_error_never_shows_the_key(
    upstreams: Upstreams, start_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "sk-wrong-key-that-must-not-leak-42"
    monkeypatch.setenv("TEST_OPENAI_KEY", wrong)
    upstreams.openai.queue(Reply(content="unused"))
    gw = start_gateway(upstreams.profiles)
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        resp = post(http, {"model": "gpt", "messages": HELLO})
        err = error_of(resp, 401, "invalid_api_key")
    assert wrong not in resp.text and wrong not in err["message"]
    assert OPENAI_KEY not in resp.text
    log = gw.data_dir / "calls.jsonl"
    gw.calls()
    assert wrong not in log.read_text()
    assert gw.calls()[0]["http_status"] == 401


@pytest.mark.parametrize("purpose", ["cache_repair", "token_count", "slot_save"])
def test_a_purpose_of_the_gateways_own_is_refused(
    gateway: Gateway, http: httpx.Client, upstreams: Upstreams, purpose: str
) -> None:
    """A caller's call cannot pass for the gateway's own work (its cache repairs, its
    records of token counts) on the page, in the report or in the metrics."""
    headers = {"X-BoundedCode-Purpose": purpose}
    chat = post(http, {"model": "local", "messages": HELLO}, **headers)
    err = error_of(chat, 400, "invalid_purpose")
    assert err["param"] == "X-BoundedCode-Purpose" and f"'{purpose}'" in err["message"]
    messages = post(
        http,
        {"model": "local", "max_tokens": 10, "messages": HELLO},
        "/v1/messages",
        **{**headers, "anthropic-version": "2023-06-01"},
    )
    assert messages.status_code == 400
    assert messages.json()["error"]["type"] == "invalid_request_error"
    assert f"'{purpose}'" in messages.json()["error"]["message"]
    responses = post(http, {"model": "local", "input": "hello"}, "/v1/responses", **headers)
    assert responses.status_code == 400
    assert responses.json()["error"]["code"] == "invalid_purpose"
    assert not [r for r in upstreams.llama.requests if r.path == "/v1/chat/completions"]
    # each refusal is recorded, under a caller's purpose, never the one it asked for
    calls = gateway.calls(repairs=True)
    assert [(c["front"], c["purpose"], c["http_status"]) for c in calls] == [
        ("chat", "agent_turn", 400),
        ("messages", "agent_turn", 400),
        ("responses", "agent_turn", 400),
    ]
