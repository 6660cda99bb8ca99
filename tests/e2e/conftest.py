"""End-to-end harness: fake upstreams and the gateway, each on 127.0.0.1 in its own thread."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
import yaml

from boundedcode_gateway.app import GatewayApp, create_app
from boundedcode_gateway.config import parse_config
from boundedcode_gateway.ingress.server import protocol_for
from boundedcode_gateway.metering.calllog import read_calls
from boundedcode_gateway.metering.records import SLOT_SAVE_PURPOSE
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE
from tests.fakes.canned import CannedUpstream
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.server import HOST, RunningServer, serve_in_thread, stop_all

# the gateway's own records that follow calls: left out of a test's calls unless asked for
FOLLOW_UPS = frozenset({REPAIR_PURPOSE, SLOT_SAVE_PURPOSE})
OPENAI_KEY = "sk-test-key-0123456789"
COMPAT_KEY = "compat-key-9876543210"


@dataclass
class Upstreams:
    """The fakes of one test, and the model profiles that point at them."""

    llama: FakeLlamaServer
    other_local: FakeLlamaServer
    openai: FakeOpenAI
    compat: FakeOpenAI
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Gateway:
    """A running gateway and what it wrote."""

    app: GatewayApp
    server: RunningServer
    data_dir: Path
    clients: list[openai.OpenAI] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def client(
        self, task: str | None = None, purpose: str | None = None, api_key: str = "unused"
    ) -> openai.OpenAI:
        headers = {}
        if task:
            headers["X-BoundedCode-Task"] = task
        if purpose:
            headers["X-BoundedCode-Purpose"] = purpose
        client = openai.OpenAI(
            base_url=self.url + "/v1", api_key=api_key, default_headers=headers, max_retries=0
        )
        self.clients.append(client)
        return client

    def stop(self) -> None:
        """Close the clients this test made, then the gateway."""
        for client in self.clients:
            client.close()
        self.server.stop()

    def settle(self, timeout_s: float = 60.0) -> None:
        """Wait until the follow-ups of earlier answers (the cache keeper's) are done, as the
        time an agent spends on its tools between turns would."""
        deadline = time.monotonic() + timeout_s
        while any(k.pending for k in self.app.service.keepers.values()):
            assert time.monotonic() < deadline, "the cache follow-ups did not finish"
            time.sleep(0.005)

    def calls(self, repairs: bool = False) -> list[dict[str, Any]]:
        """The call log; the gateway's own work for the calls (the cache keeper's repairs,
        the slot saves) only when asked for."""
        assert self.app.bus.flush(10.0)
        calls = read_calls(self.data_dir / "calls.jsonl")
        return calls if repairs else [c for c in calls if c["purpose"] not in FOLLOW_UPS]

    def saves(self) -> list[dict[str, Any]]:
        """The records of the slot saves."""
        return [c for c in self.calls(repairs=True) if c["purpose"] == SLOT_SAVE_PURPOSE]

    def ledger_rows(self, repairs: bool = False) -> list[dict[str, Any]]:
        assert self.app.bus.flush(10.0)
        with sqlite3.connect(self.data_dir / "ledger.db") as db:
            db.row_factory = sqlite3.Row
            rows = db.execute("SELECT * FROM model_calls ORDER BY started_at, rowid").fetchall()
        out = [dict(r) for r in rows]
        return out if repairs else [r for r in out if r["purpose"] not in FOLLOW_UPS]


@pytest.fixture
def upstreams(monkeypatch: pytest.MonkeyPatch) -> Iterator[Upstreams]:
    monkeypatch.setenv("TEST_OPENAI_KEY", OPENAI_KEY)
    monkeypatch.setenv("TEST_COMPAT_KEY", COMPAT_KEY)
    llama = FakeLlamaServer()
    other = FakeLlamaServer(props_enabled=False, thinking=False)
    oai = FakeOpenAI(api_key=OPENAI_KEY, models={"gpt-5.1"})
    compat = FakeOpenAI(api_key=COMPAT_KEY, models={"glm-5"}, path_prefix="/api/paas/v4")
    servers = [serve_in_thread(f.app) for f in (llama, other, oai, compat)]
    try:
        ups = Upstreams(llama, other, oai, compat)
        ups.profiles = {
            # the suite's exact cache arithmetic assumes nothing runs between two calls;
            # the repair has tests of its own (test_cache_keeper.py)
            "local": {
                "provider": "local",
                "external_url": servers[0].url,
                "server": {"cache_repair": False},
            },
            "other": {"provider": "local", "external_url": servers[1].url},
            "gpt": {
                "provider": "openai",
                "model": "gpt-5.1",
                "api_key_env": "TEST_OPENAI_KEY",
                "base_url": servers[2].url + "/v1",
            },
            "glm": {
                "provider": "openai-compatible",
                "model": "glm-5",
                "api_key_env": "TEST_COMPAT_KEY",
                "base_url": servers[3].url + "/api/paas/v4",
            },
        }
        yield ups
    finally:
        stop_all(servers)


GatewayFactory = Callable[..., Gateway]


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[GatewayFactory]:
    """Start a gateway with the given model profiles (and top-level settings)."""
    running: list[Gateway] = []

    def start(models: dict[str, dict[str, Any]], **settings: Any) -> Gateway:
        data_dir = Path(settings.pop("data_dir", tmp_path / f"gw{len(running)}"))
        text = yaml.safe_dump({"data_dir": str(data_dir), **settings, "models": models})
        config = parse_config(text)
        # served on HOST, as `serve --host` tells the app where it listens
        app = create_app(config, listen_host=HOST)
        # the HTTP protocol `boundedcode-gateway serve` runs, with the configuration's limits
        protocol = protocol_for(config.limits, config.inference.write_stall_s)
        server = serve_in_thread(app, lifespan="on", http=protocol)
        gw = Gateway(app, server, data_dir)
        running.append(gw)
        return gw

    yield start
    for gw in running:
        for client in gw.clients:
            client.close()
    stop_all([gw.server for gw in running])


@pytest.fixture
def canned() -> Iterator[CannedUpstream]:
    """An upstream that answers with exactly what the test queues (tests/fakes/canned.py)."""
    upstream = CannedUpstream()
    with serve_in_thread(upstream.app) as server:
        upstream.server = server
        yield upstream


@pytest.fixture
def gateway(upstreams: Upstreams, start_gateway: GatewayFactory) -> Gateway:
    """A gateway with one profile per upstream kind: local, other, gpt, glm."""
    return start_gateway(upstreams.profiles)


def json_of(raw: bytes) -> Any:
    return orjson.loads(raw)
