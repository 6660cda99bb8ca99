"""A web page in the user's browser: its simple cross-site POSTs (text/plain, forms, no type)
are 415, a rebound name in Host and a foreign Origin are 403 — with or without auth: — and
what real clients send passes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from boundedcode_gateway.access.keys import key_digest, new_key
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams

HELLO: list[Any] = [{"role": "user", "content": "hello"}]
BODY = orjson.dumps({"model": "local", "messages": HELLO})
KEY = new_key()


@pytest.fixture(params=["without auth", "with auth"])
def gw(
    request: pytest.FixtureRequest, upstreams: Upstreams, start_gateway: GatewayFactory
) -> Gateway:
    settings: dict[str, Any] = {"limits": {"allowed_hosts": ["gw.test.internal"]}}
    if request.param == "with auth":
        settings["auth"] = {"keys": [{"name": "ci", "sha256": key_digest(KEY), "models": ["*"]}]}
    return start_gateway(upstreams.profiles, **settings)


@pytest.fixture
def http(gw: Gateway) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=gw.url, timeout=10, headers=headers) as client:
        yield client


def error_of(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error: dict[str, Any] = resp.json()["error"]
    assert error["code"] == code and error["message"]
    return error


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain;charset=UTF-8",  # fetch() with a string body
        "application/x-www-form-urlencoded",  # a form, or curl -d without -H
        "multipart/form-data; boundary=x",
        None,  # fetch() with a Blob of no type
    ],
)
def test_a_body_a_page_may_send_without_preflight_is_415(
    gw: Gateway, http: httpx.Client, content_type: str | None
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    for path in ("/v1/chat/completions", "/tasks/t-1/v1/chat/completions"):
        resp = http.post(path, content=BODY, headers=headers)
        err = error_of(resp, 415, "unsupported_media_type")
        assert "application/json" in err["message"]
    assert gw.calls() == []  # a body refused by its type is not read


def test_json_with_parameters_passes(gw: Gateway, http: httpx.Client) -> None:
    for content_type in ("application/json; charset=utf-8", "Application/JSON"):
        resp = http.post(
            "/v1/chat/completions", content=BODY, headers={"Content-Type": content_type}
        )
        assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8780", "localhost.evil.example"])
def test_a_rebound_name_is_403(gw: Gateway, http: httpx.Client, host: str) -> None:
    headers = {"Host": host}
    chat = http.post(
        "/v1/chat/completions", json={"model": "local", "messages": HELLO}, headers=headers
    )
    assert "limits.allowed_hosts" in error_of(chat, 403, "host_not_allowed")["message"]
    error_of(http.get("/v1/models", headers=headers), 403, "host_not_allowed")
    error_of(http.get("/v1/models/local", headers=headers), 403, "host_not_allowed")
    # liveness tells nothing: it answers any Host
    assert http.get("/health", headers=headers).json() == {"status": "ok"}
    assert gw.calls() == []


@pytest.mark.parametrize("host", ["localhost", "gw.test.internal:443", "[::1]:8780"])
def test_the_gateways_own_names_pass(http: httpx.Client, host: str) -> None:
    resp = http.post(
        "/v1/chat/completions", json={"model": "local", "messages": HELLO}, headers={"Host": host}
    )
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("origin", ["https://evil.example", "http://evil.example:8780", "null"])
def test_a_foreign_origin_is_403(gw: Gateway, http: httpx.Client, origin: str) -> None:
    headers = {"Origin": origin}
    chat = http.post(
        "/v1/chat/completions", json={"model": "local", "messages": HELLO}, headers=headers
    )
    error_of(chat, 403, "origin_not_allowed")
    error_of(http.get("/v1/models", headers=headers), 403, "origin_not_allowed")
    assert gw.calls() == []


def test_the_gateways_own_origins_pass(gw: Gateway, http: httpx.Client) -> None:
    for origin in (gw.url, "http://localhost:3000", "https://gw.test.internal"):
        resp = http.post(
            "/v1/chat/completions",
            json={"model": "local", "messages": HELLO},
            headers={"Origin": origin},
        )
        assert resp.status_code == 200, resp.text


def test_the_sdk_sends_what_passes(gw: Gateway) -> None:
    reply = gw.client(api_key=KEY).chat.completions.create(model="local", messages=HELLO)
    assert reply.choices[0].message.content
