"""Reloading the configuration: calls in flight go on with the upstream they started with,
new calls take the new profiles, a configuration that does not load is refused, and a
managed llama-server whose profile did not change keeps running."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from boundedcode_gateway.access.keys import key_digest, new_key
from boundedcode_gateway.app import GatewayApp, ReloadResult, create_app
from boundedcode_gateway.config import ConfigSource, load_config
from boundedcode_gateway.ingress.server import GatheringHttpToolsProtocol
from boundedcode_gateway.live_config import Route, RouteChanges
from tests.e2e.conftest import Gateway, Upstreams
from tests.e2e.test_cli import free_port, start_serve, write_config
from tests.e2e.test_operations import by_name, scrape
from tests.fakes.common import Reply
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.llama_server_process import SLOW_ANSWER, write_binary
from tests.fakes.server import serve_in_thread, stop_all

STREAMS = 100
# 100 chunks, about 20 s: long enough that every stream is still going when a reload
# that began once all of them had started ends, on a machine busy with other tests
SLOW = Reply(content="tick " * 50, chunk_delay_ms=200)
ASK: Any = [{"role": "user", "content": "Count."}]
T = TypeVar("T")


class FileGateway:
    """A gateway started from a configuration file, and that file."""

    def __init__(self, gw: Gateway, path: Path, settings: dict[str, Any]) -> None:
        self.gw = gw
        self.path = path
        self.settings = settings

    @property
    def app(self) -> GatewayApp:
        return self.gw.app

    def write(self, models: dict[str, Any]) -> None:
        self.path.write_text(yaml.safe_dump({**self.settings, "models": models}))

    def reload(self) -> ReloadResult:
        return on_loop(self.app, self.app.reload())

    def routes(self) -> list[Route]:
        async def listed() -> list[Route]:
            return list(self.app.service.routes())

        return on_loop(self.app, listed())


def on_loop(app: GatewayApp, coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on the gateway's own event loop and wait for its result."""
    assert app.loop is not None
    return asyncio.run_coroutine_threadsafe(coro, app.loop).result(60)


def changes_of(result: ReloadResult) -> RouteChanges:
    assert result.applied and result.changes is not None, result.reason
    return result.changes


FileGatewayFactory = Callable[..., FileGateway]


@pytest.fixture
def from_file(tmp_path: Path) -> Iterator[FileGatewayFactory]:
    running: list[Gateway] = []

    def start(models: dict[str, Any], **settings: Any) -> FileGateway:
        settings = {"data_dir": str(tmp_path / f"gw{len(running)}"), **settings}
        path = tmp_path / f"gateway{len(running)}.yaml"
        path.write_text(yaml.safe_dump({**settings, "models": models}))
        app = create_app(load_config(path), ConfigSource(path))
        server = serve_in_thread(
            app, lifespan="on", http=GatheringHttpToolsProtocol, startup_timeout=30
        )
        gw = Gateway(app, server, Path(settings["data_dir"]))
        running.append(gw)
        return FileGateway(gw, path, settings)

    yield start
    for gw in running:
        for client in gw.clients:
            client.close()
    stop_all([gw.server for gw in running])


def in_flight(gw: Gateway, model: str) -> float:
    return by_name(scrape(gw), "boundedcode_gateway_requests_in_flight", "model").get(model, 0)


def test_a_reload_under_a_hundred_streams_loses_none(
    upstreams: Upstreams, from_file: FileGatewayFactory
) -> None:
    fg = from_file(upstreams.profiles)
    gw = fg.gw
    upstreams.openai.models.add("gpt-5.2")
    upstreams.openai.queue(*[SLOW] * STREAMS)
    before = {r.name: r for r in fg.routes()}
    changed = {**upstreams.profiles["gpt"], "model": "gpt-5.2"}
    fg.write({**upstreams.profiles, "gpt": changed})
    seen_first: set[int] = set()
    done: set[int] = set()

    async def one(client: openai.AsyncOpenAI, n: int) -> str:
        messages: Any = [{"role": "user", "content": f"Count, stream {n}."}]
        stream = await client.chat.completions.create(model="gpt", messages=messages, stream=True)
        text = ""
        async for chunk in stream:
            seen_first.add(n)
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        done.add(n)
        return text

    async def streams_and_reload() -> tuple[list[str], ReloadResult]:
        async with openai.AsyncOpenAI(
            base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=60
        ) as client:
            tasks = [asyncio.ensure_future(one(client, n)) for n in range(STREAMS)]
            deadline = time.monotonic() + 30
            while len(seen_first) < STREAMS:  # every stream has begun its answer
                assert time.monotonic() < deadline, f"{len(seen_first)} streams began"
                await asyncio.sleep(0.02)
            result = await asyncio.to_thread(fg.reload)
            assert not done, "a stream ended before the reload: it did not span it"
            assert await asyncio.to_thread(in_flight, gw, "gpt") == STREAMS
            texts = await asyncio.wait_for(asyncio.gather(*tasks), 60)
            return texts, result

    texts, result = asyncio.run(streams_and_reload())
    assert changes_of(result).changed == ("gpt",)
    assert texts == ["tick " * 50] * STREAMS
    rows = [r for r in gw.ledger_rows() if r["model_profile"] == "gpt"]
    assert len(rows) == STREAMS
    assert {(r["status"], r["stream"], r["upstream_model"]) for r in rows} == {("ok", 1, "gpt-5.1")}
    # unchanged profiles kept their upstream; the changed one has a new one
    after = {r.name: r for r in fg.routes()}
    assert all(after[n] is before[n] for n in ("local", "other", "glm"))
    assert after["gpt"] is not before["gpt"] and len(after) == 4  # the old one is closed
    # a new call takes the changed profile
    reply = gw.client().chat.completions.create(model="gpt", messages=ASK)
    assert reply.choices[0].message.content
    assert upstreams.openai.requests.last.body["model"] == "gpt-5.2"
    assert gw.ledger_rows()[-1]["upstream_model"] == "gpt-5.2"


def test_a_configuration_that_does_not_load_is_refused(
    upstreams: Upstreams, from_file: FileGatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    fg = from_file(upstreams.profiles)
    client = fg.gw.client()
    fg.path.write_text("models:\n  local: [unclosed\n")
    refused = fg.reload()
    assert not refused.applied and refused.reason is not None
    assert refused.reason.startswith(f"{fg.path}: not valid YAML")
    bad = {**upstreams.profiles, "gpt": {**upstreams.profiles["gpt"], "colour": "red"}}
    fg.write(bad)
    refused = fg.reload()
    line = fg.path.read_text().splitlines().index("    colour: red") + 1
    assert refused.reason == f"{fg.path}:{line}: models.gpt.colour: unknown key"
    assert "configuration not reloaded, the running one is kept" in caplog.text
    # the running configuration still serves every profile
    for model in ("local", "gpt"):
        assert client.chat.completions.create(model=model, messages=ASK).choices
    found = scrape(fg.gw)
    reloads = by_name(found, "boundedcode_gateway_config_reloads_total", "result")
    assert reloads == {"refused": 2}


def test_a_reload_adds_changes_and_removes_profiles_for_new_calls(
    upstreams: Upstreams, from_file: FileGatewayFactory
) -> None:
    fg = from_file({"local": upstreams.profiles["local"], "gpt": upstreams.profiles["gpt"]})
    client = fg.gw.client()
    fg.write({"gpt": upstreams.profiles["gpt"], "glm": upstreams.profiles["glm"]})
    changes = changes_of(fg.reload())
    assert (changes.added, changes.removed) == (("glm",), ("local",))
    assert client.chat.completions.create(model="glm", messages=ASK).choices
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="local", messages=ASK)
    models = {m.id for m in client.models.list()}
    assert models == {"gpt", "glm"}
    ready = httpx.get(fg.gw.url + "/ready", timeout=10).json()
    assert set(ready["models"]) == {"gpt", "glm"}
    # the limit on bodies is part of the configuration too
    fg.settings["max_body_mib"] = 0.001
    fg.write({"gpt": upstreams.profiles["gpt"]})
    assert fg.reload().applied
    long: Any = [{"role": "user", "content": "x" * 2000}]
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="gpt", messages=long)
    assert info.value.status_code == 413


def test_a_reload_changes_keys_allowed_hosts_and_budgets(
    upstreams: Upstreams, from_file: FileGatewayFactory
) -> None:
    old_key, new_key_ = new_key(), new_key()

    def auth(key: str, models: list[str]) -> dict[str, Any]:
        return {"keys": [{"name": "ci", "sha256": key_digest(key), "models": models}]}

    models = {"gpt": upstreams.profiles["gpt"], "glm": upstreams.profiles["glm"]}
    roomy = {"task": {"max_tokens": 1_000_000, "per": "lifetime"}}
    fg = from_file(models, auth=auth(old_key, ["gpt"]), budgets=roomy)
    chat = fg.gw.url + "/v1/chat/completions"

    def status(key: str, model: str = "gpt", host: str = "127.0.0.1", task: str = "t") -> int:
        body = {"model": model, "messages": ASK}
        headers = {"Authorization": f"Bearer {key}", "Host": host, "X-BoundedCode-Task": task}
        return httpx.post(chat, json=body, headers=headers, timeout=10).status_code

    assert (status(old_key), status(old_key, "glm"), status(new_key_)) == (200, 403, 401)
    assert status(old_key, host="gateway.example") == 403
    fg.settings["auth"] = auth(new_key_, ["*"])
    fg.settings["limits"] = {"allowed_hosts": ["gateway.example"]}
    fg.settings["budgets"] = {"task": {"max_tokens": 1, "per": "lifetime"}}
    fg.write(models)
    changes = changes_of(fg.reload())
    # no upstream is rebuilt for keys, hosts or budgets
    assert set(changes.unchanged) == {"gpt", "glm"}
    assert status(old_key) == 401
    # the new key and host are let in; task t spent more than the new budget before
    assert status(new_key_, "glm", host="gateway.example") == 429
    assert (status(new_key_, task="u"), status(new_key_, task="u")) == (200, 429)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a child that exited but was not reaped yet is a zombie: gone for this purpose; one
    # reaped between the signal and the read is gone too
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def managed_pid(fg: FileGateway, name: str) -> int:
    pid = fg.app.fleets[name].managed.pid  # type: ignore[union-attr]
    assert isinstance(pid, int)
    return pid


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_managed_server_runs_on_unless_its_profile_changed(
    upstreams: Upstreams, from_file: FileGatewayFactory, tmp_path: Path
) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")

    def managed_profile(answer_ms: int) -> dict[str, Any]:
        extra_args = ["--fake-slow-answer-ms", str(answer_ms)]
        server = {"extra_args": extra_args, "cache_repair": False}
        return {"provider": "local", "model_path": str(model), "server": server}

    managed = managed_profile(80)  # 100 chunks: about 8 s, to span a start
    fg = from_file(
        {"managed": managed, "gpt": upstreams.profiles["gpt"]},
        llama_server_bin=str(write_binary(tmp_path)),
    )
    resp = httpx.get(fg.gw.url + "/ready", timeout=10)
    assert resp.status_code == 200 and resp.json()["models"]["managed"] == {"ready": True}
    first = managed_pid(fg, "managed")
    upstream = fg.app.upstreams["managed"]

    # another profile changes: the server is not touched
    gpt = {**upstreams.profiles["gpt"], "retry": {"max_attempts": 2}}
    fg.write({"managed": managed, "gpt": gpt})
    assert changes_of(fg.reload()).unchanged == ("managed",)
    assert fg.app.upstreams["managed"] is upstream and managed_pid(fg, "managed") == first
    assert alive(first)

    # its own profile changes: a new server takes new calls, the old one finishes its call
    client = fg.gw.client()
    stream = client.chat.completions.create(model="managed", messages=ASK, stream=True)
    chunks = iter(stream)
    text = next(c.choices[0].delta.content or "" for c in chunks if c.choices)
    fg.write({"managed": managed_profile(1), "gpt": gpt})
    assert changes_of(fg.reload()).changed == ("managed",)
    second = managed_pid(fg, "managed")
    assert second != first and alive(second)
    assert alive(first), "the old server was stopped with a call still on it"
    text += "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == SLOW_ANSWER
    wait_for(lambda: not alive(first), "the old server was not stopped after its last call")
    reply = client.chat.completions.create(model="managed", messages=ASK)
    assert reply.choices[0].message.content == SLOW_ANSWER
    assert [r["status"] for r in fg.gw.ledger_rows()] == ["ok", "ok"]

    # a server that dies is restarted, and counted
    os.kill(second, signal.SIGKILL)

    def restarting() -> bool:
        resp = httpx.get(fg.gw.url + "/ready", timeout=10)
        reason = resp.json()["models"]["managed"].get("reason")
        return resp.status_code == 503 and reason == "its llama-server is restarting"

    wait_for(restarting, "/ready did not show the restart")
    wait_for(lambda: httpx.get(fg.gw.url + "/ready", timeout=10).status_code == 200, "ready")
    restarts = by_name(scrape(fg.gw), "boundedcode_gateway_llama_server_restarts_total", "model")
    assert restarts == {"managed": 1}


def test_sighup_reloads_a_running_serve(tmp_path: Path) -> None:
    fake = FakeLlamaServer()
    with serve_in_thread(fake.app) as upstream:
        config = write_config(tmp_path, upstream.url)
        port = free_port()
        proc = start_serve(config, port)
        url = f"http://127.0.0.1:{port}"
        try:
            settings = yaml.safe_load(config.read_text())
            local = settings["models"]["local"]
            both = {"local": local, "second": local}
            config.write_text(yaml.safe_dump({**settings, "models": both}))
            os.kill(proc.pid, signal.SIGHUP)

            def listed() -> set[str]:
                return {m["id"] for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]}

            wait_for(lambda: listed() == {"local", "second"}, "SIGHUP did not reload")
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            with client:
                assert client.chat.completions.create(model="second", messages=ASK).choices
                config.write_text("models: [\n")
                os.kill(proc.pid, signal.SIGHUP)

                wait_for(
                    lambda: reloads_of(url).get("refused") == 1,
                    "the broken configuration was not refused",
                )
                assert listed() == {"local", "second"}
                assert client.chat.completions.create(model="second", messages=ASK).choices
        finally:
            proc.send_signal(signal.SIGTERM)
            output = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 0, output
    assert "configuration reloaded: added second; unchanged local" in output
    assert f"configuration not reloaded, the running one is kept: {config}" in output


def reloads_of(url: str) -> dict[str, float]:
    """The reloads a gateway counted, by result."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "boundedcode_gateway_config_reloads_total":
                out[s.labels["result"]] = s.value
    return out


def test_a_reload_needs_a_started_gateway_and_a_source(
    gateway: Gateway, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the in-process fixture was given a configuration, not a file to read again
    result = on_loop(gateway.app, gateway.app.reload())
    assert result == ReloadResult(False, "the gateway was not started from a configuration source")

    async def before_start() -> ReloadResult:
        unstarted = create_app(gateway.app.config)
        try:
            return await unstarted.reload()
        finally:
            await unstarted.shutdown()

    assert asyncio.run(before_start()).reason == "the gateway is still starting"

    async def failing(config: Any) -> ReloadResult:
        raise RuntimeError("a fault while reloading")

    # a reload a signal started in a task of its own: a fault is logged, the gateway serves
    monkeypatch.setattr(gateway.app, "_reload", failing)

    async def signalled() -> None:
        gateway.app.reload_soon()
        await asyncio.gather(*gateway.app._reloads, return_exceptions=True)

    on_loop(gateway.app, signalled())
    assert "configuration reload failed" in caplog.text
    assert "a fault while reloading" in caplog.text
    assert gateway.client().chat.completions.create(model="local", messages=ASK).choices
