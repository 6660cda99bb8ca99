"""Caller keys and task tokens at the gateway: every endpoint refuses a missing or wrong
credential with a 401, a credential used beyond its models or task gets a 403, the SDKs
raise their own errors for both, and no key or token is ever written anywhere."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from boundedcode_gateway.access.keys import key_digest, new_key
from boundedcode_gateway.access.tokens import mint_task_token
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply

# LiteLLM fetches a price list over the network when imported unless told not to
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
import litellm
from litellm.exceptions import APIError, AuthenticationError

HELLO: list[Any] = [{"role": "user", "content": "hello"}]
SECRET_ENV = "TEST_GATEWAY_TOKEN_SECRET"
SECRET = "the-token-secret-of-this-test-0123456789"
OTHER_SECRET = "another-token-secret-of-32-bytes-or-more"
# made fresh for each run, so finding one in a file can only mean the gateway wrote it
LOCAL_KEY = new_key()
OPS_KEY = new_key()
ADMIN_KEY = new_key()
AUTH = {
    "token_secret_env": SECRET_ENV,
    "keys": [
        {"name": "ci", "sha256": key_digest(LOCAL_KEY), "models": ["local"]},
        {"name": "ops", "sha256": key_digest(OPS_KEY), "models": ["*"]},
        {"name": "admin", "sha256": key_digest(ADMIN_KEY), "models": ["*"], "admin": True},
    ],
}
CHAT_PATHS = ["/v1/chat/completions", "/chat/completions", "/tasks/t-1/v1/chat/completions"]
ENDPOINTS = [
    *(("POST", path) for path in CHAT_PATHS),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/local"),
    ("GET", "/v1/no-such-path"),
]


def token(
    task: str = "t-1",
    models: tuple[str, ...] = ("local",),
    ttl_s: float = 3600,
    secret: str = SECRET,
    now: float | None = None,
) -> str:
    return mint_task_token(secret, task=task, models=models, ttl_s=ttl_s, now=now)


def tampered(valid: str) -> str:
    prefix, claims, signature = valid.split(".")
    return f"{prefix}.{claims[:-3]}{'A' if claims[-3] != 'A' else 'B'}{claims[-2:]}.{signature}"


@pytest.fixture
def secured(
    upstreams: Upstreams, start_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> Gateway:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    return start_gateway(upstreams.profiles, auth=AUTH)


@pytest.fixture
def http(secured: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=secured.url, timeout=10) as client:
        yield client


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def request(
    http: httpx.Client, method: str, path: str, headers: dict[str, str], model: str = "local"
) -> httpx.Response:
    if method == "GET":
        return http.get(path, headers=headers)
    return http.post(path, json={"model": model, "messages": HELLO}, headers=headers)


def error_of(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code
    return body["error"]  # type: ignore[no-any-return]


BAD_CREDENTIALS: dict[str, Callable[[], dict[str, str]]] = {
    "none": lambda: {},
    "wrong key": lambda: bearer(new_key()),
    "digest as key": lambda: bearer(key_digest(LOCAL_KEY)),
    "basic scheme": lambda: {"Authorization": f"Basic {LOCAL_KEY}"},
    "expired token": lambda: bearer(token(ttl_s=60, now=1_000_000.0)),
    "tampered token": lambda: bearer(tampered(token())),
    "token of another secret": lambda: bearer(token(secret=OTHER_SECRET)),
}


@pytest.mark.parametrize("credential", list(BAD_CREDENTIALS))
def test_every_endpoint_refuses_a_missing_or_wrong_credential(
    secured: Gateway, http: httpx.Client, credential: str
) -> None:
    headers = BAD_CREDENTIALS[credential]()
    for method, path in ENDPOINTS:
        resp = request(http, method, path, headers)
        err = error_of(resp, 401, "invalid_api_key")
        assert resp.headers["www-authenticate"] == "Bearer"
        assert err["type"] == "invalid_request_error"
        if credential == "expired token":
            assert "expired" in err["message"]
    # liveness needs no key
    assert http.get("/health").json() == {"status": "ok"}
    # an unauthenticated caller writes nothing: no record of the models it named
    assert secured.calls() == []


def test_a_key_answers_within_its_models(
    secured: Gateway, http: httpx.Client, upstreams: Upstreams
) -> None:
    ok = request(http, "POST", "/v1/chat/completions", bearer(LOCAL_KEY))
    assert ok.status_code == 200 and ok.json()["choices"]
    for model in ("gpt", "no-such-model"):
        refused = request(http, "POST", "/v1/chat/completions", bearer(LOCAL_KEY), model)
        err = error_of(refused, 403, "model_not_allowed")
        assert err["type"] == "permission_error" and err["param"] == "model"
    assert not upstreams.openai.requests  # nothing was sent for the refused calls
    calls = secured.calls()
    assert [
        (c["model_profile"], c["caller"], c["http_status"], c["error_code"]) for c in calls
    ] == [
        ("local", "ci", 200, None),
        ("gpt", "ci", 403, "model_not_allowed"),
        ("no-such-model", "ci", 403, "model_not_allowed"),
    ]
    assert [r["caller"] for r in secured.ledger_rows()] == ["ci", "ci", "ci"]


def test_the_models_a_key_may_not_use_are_not_shown(http: httpx.Client) -> None:
    listed = http.get("/v1/models", headers=bearer(LOCAL_KEY)).json()
    assert [m["id"] for m in listed["data"]] == ["local"]
    assert http.get("/v1/models/local", headers=bearer(LOCAL_KEY)).json()["id"] == "local"
    error_of(http.get("/v1/models/gpt", headers=bearer(LOCAL_KEY)), 404, "model_not_found")
    everything = http.get("/v1/models", headers=bearer(OPS_KEY)).json()
    assert sorted(m["id"] for m in everything["data"]) == ["glm", "gpt", "local", "other"]
    assert http.get("/v1/models/gpt", headers=bearer(OPS_KEY)).json()["id"] == "gpt"


def test_a_token_is_metered_under_its_task(secured: Gateway, http: httpx.Client) -> None:
    valid = token(task="t-1", models=("local", "gpt"))
    task_header = {"X-BoundedCode-Task": "t-1"}
    for path, headers in [
        ("/tasks/t-1/v1/chat/completions", {}),
        ("/v1/chat/completions", task_header),
        ("/v1/chat/completions", {}),  # names no task: the token's
    ]:
        resp = request(http, "POST", path, {**bearer(valid), **headers})
        assert resp.status_code == 200, resp.text
    calls = secured.calls()
    assert {c["task"] for c in calls} == {"t-1"}
    (name,) = {c["caller"] for c in calls}
    assert name.startswith("token:") and valid not in name
    listed = http.get("/v1/models", headers=bearer(valid)).json()
    assert sorted(m["id"] for m in listed["data"]) == ["gpt", "local"]


def test_a_token_outside_its_task_or_models_is_403(secured: Gateway, http: httpx.Client) -> None:
    valid = bearer(token(task="t-1"))
    other_path = request(http, "POST", "/tasks/t-2/v1/chat/completions", valid)
    assert "'t-1'" in error_of(other_path, 403, "task_mismatch")["message"]
    other_header = request(
        http, "POST", "/v1/chat/completions", {**valid, "X-BoundedCode-Task": "t-2"}
    )
    error_of(other_header, 403, "task_mismatch")
    error_of(request(http, "POST", "/v1/chat/completions", valid, "gpt"), 403, "model_not_allowed")
    error_of(http.get("/v1/models/gpt", headers=valid), 404, "model_not_found")
    # each refusal is recorded under the token's own task, never the one it asked for
    calls = secured.calls()
    assert [(c["task"], c["http_status"], c["error_code"]) for c in calls] == [
        ("t-1", 403, "task_mismatch"),
        ("t-1", 403, "task_mismatch"),
        ("t-1", 403, "model_not_allowed"),
    ]


def test_the_openai_sdk_raises_its_auth_errors(secured: Gateway, upstreams: Upstreams) -> None:
    upstreams.openai.queue(Reply(content="Hello from the cloud."))
    with pytest.raises(openai.AuthenticationError) as unknown:
        secured.client(api_key=new_key()).chat.completions.create(model="local", messages=HELLO)
    assert unknown.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        secured.client(api_key=tampered(token())).models.list()
    with pytest.raises(openai.PermissionDeniedError) as denied:
        secured.client(api_key=LOCAL_KEY).chat.completions.create(model="gpt", messages=HELLO)
    assert denied.value.code == "model_not_allowed"
    with pytest.raises(openai.PermissionDeniedError) as mismatch:
        secured.client(api_key=token(), task="t-2").chat.completions.create(
            model="local", messages=HELLO
        )
    assert mismatch.value.code == "task_mismatch"
    with pytest.raises(openai.NotFoundError):
        secured.client(api_key=LOCAL_KEY).models.retrieve("gpt")
    assert [m.id for m in secured.client(api_key=LOCAL_KEY).models.list()] == ["local"]
    reply = secured.client(api_key=OPS_KEY).chat.completions.create(model="gpt", messages=HELLO)
    assert reply.choices[0].message.content == "Hello from the cloud."
    streamed = secured.client(api_key=token(models=("local",))).chat.completions.create(
        model="local", messages=HELLO, stream=True
    )
    assert any(c.choices and c.choices[0].delta.content for c in streamed)


def litellm_call(gw: Gateway, model: str, api_key: str, **extra: Any) -> Any:
    return litellm.completion(
        model=f"openai/{model}",
        api_base=gw.url + "/v1",
        api_key=api_key,
        messages=HELLO,
        num_retries=0,
        **extra,
    )


def test_litellm_raises_its_auth_errors(secured: Gateway) -> None:
    with pytest.raises(AuthenticationError):
        litellm_call(secured, "local", new_key())
    with pytest.raises(AuthenticationError):
        litellm_call(secured, "local", token(ttl_s=60, now=1_000_000.0))
    # LiteLLM's OpenAI-compatible client has no class of its own for a 403: its APIError
    # carries the status and the gateway's message
    with pytest.raises(APIError) as denied:
        litellm_call(secured, "gpt", LOCAL_KEY)
    assert denied.value.status_code == 403 and "may not use the model 'gpt'" in str(denied.value)
    with pytest.raises(APIError) as mismatch:
        litellm_call(secured, "local", token(), extra_headers={"X-BoundedCode-Task": "t-2"})
    assert mismatch.value.status_code == 403 and "is for task 't-1'" in str(mismatch.value)
    assert litellm_call(secured, "local", LOCAL_KEY).choices[0].message.content
    chunks = list(litellm_call(secured, "local", token(), stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("path", ["/metrics", "/ready"])
def test_the_operators_endpoints_answer_an_admin_key_only(
    http: httpx.Client, gateway: Gateway, path: str
) -> None:
    assert http.get(path).status_code == 401
    for credential in (OPS_KEY, token()):
        refused = http.get(path, headers=bearer(credential))
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "admin_required"
    answered = http.get(path, headers=bearer(ADMIN_KEY))
    # /ready is 503 while a profile cannot take calls; either way the admin is answered
    assert answered.status_code in (200, 503)
    assert answered.headers["content-type"].startswith(
        "text/plain" if path == "/metrics" else "application/json"
    )
    # without auth:, on loopback, they are open
    assert httpx.get(gateway.url + path, timeout=10).status_code in (200, 503)
    assert httpx.get(gateway.url + "/health", timeout=10).status_code == 200


def test_a_credential_that_is_not_ascii_is_a_401(http: httpx.Client) -> None:
    for credential in ("Bearer ключ".encode(), b"Bearer \xff\xfe", "Bearer bcg_ö".encode()):
        refused = http.get("/v1/models", headers={b"Authorization": credential})
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"


def test_no_auth_means_no_caller_and_no_checks(gateway: Gateway) -> None:
    reply = gateway.client(api_key="anything at all").chat.completions.create(
        model="gpt", messages=HELLO
    )
    assert reply.choices
    assert sorted(m.id for m in gateway.client().models.list()) == ["glm", "gpt", "local", "other"]
    assert gateway.calls()[0]["caller"] is None


def test_no_key_or_token_is_written_anywhere(
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(SECRET_ENV, SECRET)
    data_dir = tmp_path / "data"
    gw = start_gateway(upstreams.profiles, auth=AUTH, data_dir=data_dir)
    valid = token(models=("local", "gpt"))
    expired = token(ttl_s=60, now=1_000_000.0)
    wrong_key = new_key()
    forged = tampered(token())
    upstreams.openai.queue(Reply(content="ok"), Reply(status=500))
    answers: list[str] = []
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        for credential, model, task in [
            (LOCAL_KEY, "local", "t-1"),  # answered
            (LOCAL_KEY, "gpt", "t-1"),  # 403
            (valid, "gpt", None),  # answered
            (valid, "gpt", "t-2"),  # 403
            (valid, "gpt", None),  # the upstream's 500
            (valid, "claude", None),  # 403
            (expired, "local", None),  # 401
            (forged, "local", None),  # 401
            (wrong_key, "local", None),  # 401
        ]:
            headers = bearer(credential) | ({"X-BoundedCode-Task": task} if task else {})
            for stream in (False, True):
                body = {"model": model, "messages": HELLO, "stream": stream}
                resp = http.post("/v1/chat/completions", json=body, headers=headers)
                answers.append(resp.text)
            answers.append(http.get("/v1/models", headers=headers).text)
        # what an operator reads: the metrics and the readiness of every profile
        for endpoint in ("/metrics", "/ready"):
            answers.append(http.get(endpoint, headers=bearer(ADMIN_KEY)).text)
        assert "boundedcode_gateway_requests_total" in answers[-2]
    assert gw.calls()  # the calls were recorded...
    gw.settle()
    gw.stop()  # ...and everything the gateway writes is on disk
    written = [p for p in data_dir.rglob("*") if p.is_file()]
    assert {p.name for p in written} >= {"calls.jsonl", "ledger.db"}
    secrets = [LOCAL_KEY, OPS_KEY, ADMIN_KEY, valid, expired, wrong_key, forged, SECRET]
    # the signature alone would let no one in, but it is no one's business either
    secrets += [t.rsplit(".", 1)[1] for t in (valid, expired, forged)]
    out, err = capfd.readouterr()
    sent_upstream = [
        repr(r.headers).encode() + r.raw_body
        for r in (*upstreams.llama.requests, *upstreams.openai.requests)
    ]
    assert sent_upstream
    for secret in secrets:
        # the caller's credential is the gateway's business, not the upstream's
        assert not any(secret.encode() in sent for sent in sent_upstream)
        for path in written:
            assert secret.encode() not in path.read_bytes(), path
        assert secret not in caplog.text and secret not in out and secret not in err
        assert not any(secret in answer for answer in answers)
