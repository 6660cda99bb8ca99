"""The managed llama-server is no side door: after a call through the gateway whose
prompt held a secret, the server's own port refuses every request without the key of its
current start (a page's ``Origin`` gets no echo), its ``/slots`` shows nothing to such a
request, and the process holds none of the gateway's secrets, nor its key in its
command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import MODEL, start_real_gateway

SECRET = "sk-SIDE-DOOR-7f3a9c"
CLOUD_KEY = "sk-cloud-key-of-the-gateway-0123456789"
TOKEN_SECRET = "token-secret-of-the-gateway-0123456789abcdef"
EVIL = "http://evil.example"


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(p.split("=", 1) for p in raw.split("\0") if "=" in p)


def _no_foreign_origin(resp: httpx.Response) -> None:
    assert EVIL not in resp.headers.get("access-control-allow-origin", "")
    assert resp.headers.get("access-control-allow-credentials", "false") != "true"


def test_the_managed_server_refuses_what_comes_without_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", CLOUD_KEY)
    monkeypatch.setenv("BOUNDEDCODE_TOKEN_SECRET", TOKEN_SECRET)
    profile = {"provider": "local", "model_path": MODEL, "server": {"ctx_size": 1024}}
    gw = start_real_gateway(tmp_path, {"smol": profile})
    try:
        managed: Any = gw.app.fleets["smol"].managed
        root, pid = managed.base_url(), managed.pid
        ask = {"role": "user", "content": f"Remember the password {SECRET}. Say ok."}
        answer = httpx.post(
            gw.url + "/v1/chat/completions",
            json={"model": "smol", "messages": [ask], "max_tokens": 4},
            timeout=120,
        )
        assert answer.status_code == 200
        gw.settle()
        evil = {"Origin": EVIL}

        # every route but the health check's is refused without the key, however asked
        for path in ("/slots", "/props", "/v1/models", "/models", "/metrics", "/slots?id=0"):
            resp = httpx.get(root + path, headers=evil, timeout=10)
            assert resp.status_code == 401, path
            assert SECRET not in resp.text
            _no_foreign_origin(resp)
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for path in ("/v1/chat/completions", "/completion", "/apply-template"):
            resp = httpx.post(root + path, json=chat, headers=evil, timeout=10)
            assert resp.status_code == 401, path
            _no_foreign_origin(resp)
        wrong = {**evil, "Authorization": "Bearer guessed", "X-Api-Key": "guessed"}
        assert httpx.get(root + "/slots", headers=wrong, timeout=10).status_code == 401
        # what stays open says only that the server is up, and to no page
        health = httpx.get(root + "/health", headers=evil, timeout=10)
        assert health.status_code == 200 and SECRET not in health.text
        _no_foreign_origin(health)
        preflight = httpx.options(
            root + "/slots",
            headers={**evil, "Access-Control-Request-Method": "GET"},
            timeout=10,
        )
        _no_foreign_origin(preflight)

        # the slot's text is there, for the cache keeper's requests alone
        keyed = httpx.get(root + "/slots", headers=managed.auth_headers(), timeout=10)
        assert keyed.status_code == 200 and SECRET in keyed.text

        env = _environ(pid)
        values = set(env.values())
        assert "OPENAI_API_KEY" not in env and CLOUD_KEY not in values
        assert "BOUNDEDCODE_TOKEN_SECRET" not in env and TOKEN_SECRET not in values
        key = env["LLAMA_API_KEY"]
        assert {"Authorization": f"Bearer {key}"} == managed.auth_headers()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        assert key not in cmdline and "api-key" not in cmdline
    finally:
        gw.stop()
