"""Cloud upstreams through the HTTP proxy that HTTPS_PROXY / HTTP_PROXY name, NO_PROXY aside.

The upstreams have names only the proxy can reach (``*.proxy-test.invalid``, served on
127.0.0.1), as behind a company proxy; HTTPS goes through a CONNECT tunnel with TLS
inside it, plain HTTP as absolute-form requests. The test's resolver maps the names
for the one upstream NO_PROXY sends directly.
"""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from tests.e2e.conftest import Gateway, GatewayFactory
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.common import Reply
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.proxy import FakeProxy
from tests.fakes.server import RunningServer, serve_in_thread, stop_all

KEY = "sk-proxy-test-0123456789"
DOMAIN = "proxy-test.invalid"
OPENAI_HOST, ANTHROPIC_HOST, COMPAT_HOST, DIRECT_HOST = (
    f"{name}.{DOMAIN}" for name in ("openai", "anthropic", "compat", "direct")
)
USER, PASSWORD = "gateway", "s3cret@pw"  # the @ is percent-encoded in the proxy URL


@dataclass
class Setup:
    proxy: FakeProxy
    gpt: FakeOpenAI
    claude: FakeAnthropic
    compat: FakeOpenAI
    llama: FakeLlamaServer
    models: dict[str, dict[str, Any]]


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Setup]:
    ca = trustme.CA()
    cert = ca.issue_cert(OPENAI_HOST, ANTHROPIC_HOST, DIRECT_HOST)
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    tls = (str(cert_file), str(key_file))
    gpt, claude = FakeOpenAI(api_key=KEY, models={"gpt-5.1"}), FakeAnthropic(api_key=KEY)
    compat, llama = FakeOpenAI(api_key=KEY, models={"glm-5"}), FakeLlamaServer()
    servers: list[RunningServer] = [
        serve_in_thread(gpt.app, tls=tls),
        serve_in_thread(claude.app, tls=tls),
        serve_in_thread(compat.app),
        serve_in_thread(llama.app),
    ]
    proxy = FakeProxy({OPENAI_HOST, ANTHROPIC_HOST, COMPAT_HOST}).start()
    proxy_url = f"http://{USER}:{PASSWORD.replace('@', '%40')}@127.0.0.1:{proxy.port}"
    monkeypatch.setenv("PROXY_TEST_KEY", KEY)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    monkeypatch.setenv("HTTPS_PROXY", proxy_url)
    monkeypatch.setenv("http_proxy", proxy_url)  # the lower-case name counts as well
    monkeypatch.setenv("NO_PROXY", f"example.org, .{DIRECT_HOST}")
    _resolve_for_the_test(monkeypatch, DIRECT_HOST)
    gpt_port, claude_port, compat_port = (s.port for s in servers[:3])
    # a second attempt, were a refusal resent, would show in the call log
    once = {"retry": {"max_attempts": 2}}
    models: dict[str, dict[str, Any]] = {
        "gpt": {
            "provider": "openai",
            "model": "gpt-5.1",
            "api_key_env": "PROXY_TEST_KEY",
            "base_url": f"https://{OPENAI_HOST}:{gpt_port}/v1",
            **once,
        },
        "claude": {
            "provider": "anthropic",
            "model": "claude-sonnet-4-5",
            "api_key_env": "PROXY_TEST_KEY",
            "base_url": f"https://{ANTHROPIC_HOST}:{claude_port}/v1",
            **once,
        },
        "compat": {
            "provider": "openai-compatible",
            "model": "glm-5",
            "api_key_env": "PROXY_TEST_KEY",
            "base_url": f"http://{COMPAT_HOST}:{compat_port}/v1",
            **once,
        },
        "direct": {
            "provider": "openai",
            "model": "gpt-5.1",
            "api_key_env": "PROXY_TEST_KEY",
            "base_url": f"https://{DIRECT_HOST}:{gpt_port}/v1",
            **once,
        },
        "local": {"provider": "local", "external_url": servers[3].url},
    }
    try:
        yield Setup(proxy, gpt, claude, compat, llama, models)
    finally:
        proxy.stop()
        stop_all(servers)


def _resolve_for_the_test(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Names that resolve to 127.0.0.1 in this process, where a direct connection needs them."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host in names else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def chat(gw: Gateway, model: str, stream: bool = False) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    # the test's own client must not use the proxy the environment names for the gateway
    with httpx.Client(trust_env=False, timeout=30) as client:
        return client.post(gw.url + "/v1/chat/completions", json=body)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_https_upstreams_go_through_a_connect_tunnel(
    setup: Setup, start_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    gw = start_gateway(setup.models)
    setup.gpt.queue(Reply(content="through the tunnel"), Reply(content="streamed tunnel"))
    setup.claude.queue(Reply(content="claude via proxy"), Reply(content="and streamed"))
    whole = chat(gw, "gpt")
    assert whole.status_code == 200, whole.text
    assert whole.json()["choices"][0]["message"]["content"] == "through the tunnel"
    streamed = chat(gw, "gpt", stream=True)
    assert b'"content":"streamed"' in streamed.content  # one token per delta
    assert streamed.content.endswith(b"data: [DONE]\n\n")
    assert chat(gw, "claude").json()["choices"][0]["message"]["content"] == "claude via proxy"
    assert chat(gw, "claude", stream=True).content.endswith(b"data: [DONE]\n\n")

    assert {s.method for s in setup.proxy.seen} == {"CONNECT"}
    for host in (OPENAI_HOST, ANTHROPIC_HOST):
        tunnels = [s for s in setup.proxy.seen if s.target.startswith(host + ":")]
        assert tunnels, setup.proxy.seen
        for seen in tunnels:
            assert seen.headers["proxy-authorization"] == basic(USER, PASSWORD)
            assert seen.sni == host  # TLS inside the tunnel names the upstream, not the proxy
    # the password is sent to the proxy and nowhere else
    assert PASSWORD not in caplog.text and "s3cret" not in caplog.text
    assert f"127.0.0.1:{setup.proxy.port}" in caplog.text  # the start-up line names the proxy
    assert "s3cret" not in json.dumps(gw.calls())


def test_plain_http_upstreams_go_as_absolute_form_requests(
    setup: Setup, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(setup.models)
    setup.compat.queue(Reply(content="plain through proxy"), Reply(content="plain streamed"))
    whole = chat(gw, "compat")
    assert whole.json()["choices"][0]["message"]["content"] == "plain through proxy"
    assert chat(gw, "compat", stream=True).content.endswith(b"data: [DONE]\n\n")
    port = setup.models["compat"]["base_url"].rsplit(":", 1)[1].split("/")[0]
    requests = [s for s in setup.proxy.seen if s.method == "POST"]
    assert [s.target for s in requests] == [f"http://{COMPAT_HOST}:{port}/v1/chat/completions"] * 2
    for seen in requests:
        assert seen.headers["proxy-authorization"] == basic(USER, PASSWORD)
        assert seen.headers["host"] == f"{COMPAT_HOST}:{port}"
        assert seen.headers["authorization"] == f"Bearer {KEY}"  # the upstream's own key


def test_no_proxy_hosts_and_loopback_are_reached_directly(
    setup: Setup, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(setup.models)
    setup.gpt.queue(Reply(content="direct"))
    setup.llama.queue(Reply(content="local"))
    assert chat(gw, "direct").json()["choices"][0]["message"]["content"] == "direct"
    assert chat(gw, "local").json()["choices"][0]["message"]["content"] == "local"
    assert setup.proxy.seen == []  # NO_PROXY's .direct… entry, and 127.0.0.1 always


def test_an_upstream_the_proxy_cannot_reach_is_unavailable(
    setup: Setup, start_gateway: GatewayFactory
) -> None:
    models = dict(setup.models)
    models["nowhere"] = {**models["gpt"], "base_url": f"https://nowhere.{DOMAIN}:9/v1"}
    gw = start_gateway(models)
    answer = chat(gw, "nowhere")  # the proxy answers its CONNECT with 502
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert error["code"] == "upstream_unavailable"
    assert f"through the proxy 127.0.0.1:{setup.proxy.port}" in error["message"]
    assert "502" in error["message"]
    assert gw.calls()[-1]["attempts"] == 2  # resent once, as a refused connection is


@pytest.mark.parametrize("status", [407, 403])
def test_a_proxy_that_refuses_is_a_named_error_and_the_gateway_keeps_serving(
    setup: Setup, start_gateway: GatewayFactory, status: int
) -> None:
    gw = start_gateway(setup.models)
    setup.proxy.refuse = status
    for model in ("gpt", "compat"):  # CONNECT, and (for 407) an absolute-form request
        answer = chat(gw, model)
        if model == "compat" and status == 403:
            assert answer.status_code == 403  # a 403 to a forwarded request is the upstream's
            continue
        assert answer.status_code == 502, answer.text
        error = answer.json()["error"]
        assert error["code"] == "proxy_refused" and error["type"] == "upstream_error"
        assert f"127.0.0.1:{setup.proxy.port}" in error["message"]
        assert str(status) in error["message"]
        assert "s3cret" not in answer.text
    calls = gw.calls()
    refused = [c for c in calls if c["attempt_log"][-1]["code"] == "proxy_refused"]
    assert refused and all(c["attempts"] == 1 for c in refused)  # never resent
    setup.llama.queue(Reply(content="still serving"))
    assert chat(gw, "local").json()["choices"][0]["message"]["content"] == "still serving"
    with httpx.Client(trust_env=False, timeout=5) as client:
        assert client.get(gw.url + "/health").status_code == 200
