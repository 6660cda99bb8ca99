"""The Models view follows a managed llama-server through its death and restart."""

from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path

import pytest

from tests.browser.conftest import OpenPage
from tests.e2e.conftest import GatewayFactory
from tests.fakes.llama_server_process import write_binary

pytestmark = pytest.mark.browser

SERVER = ".model-card[data-model='managed'] .server"
# a restart takes at least this long, so that a view polled every 2 s sees it
RESTART_PAUSE_S = 3


def write_slow_restarter(folder: Path) -> Path:
    """The fake llama-server program, which waits a while before every start but its first."""
    fake = write_binary(folder)
    started = shlex.quote(str(folder / "started-once"))
    binary = folder / "fake-llama-server-slow-restart"
    binary.write_text(
        "#!/bin/sh\n"
        f"if [ -e {started} ]; then sleep {RESTART_PAUSE_S}; fi\n"
        f"touch {started}\n"
        f'exec {shlex.quote(str(fake))} "$@"\n'
    )
    binary.chmod(0o755)
    return binary


def test_a_killed_server_goes_from_ready_to_restarting_and_back(
    start_gateway: GatewayFactory, open_page: OpenPage, tmp_path: Path
) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    managed = {"provider": "local", "model_path": str(model), "server": {"cache_repair": False}}
    gw = start_gateway({"managed": managed}, llama_server_bin=str(write_slow_restarter(tmp_path)))
    watched = open_page(gw.url, "#models")
    page = watched.page

    page.wait_for_selector(f"{SERVER}[data-state='ready']")
    pid = int(page.get_attribute(SERVER, "data-pid") or 0)
    assert pid == gw.app.fleets["managed"].managed.pid  # type: ignore[union-attr]
    assert page.text_content(f"{SERVER} [data-field='restarts'] dd") == "0"
    assert page.text_content(f"{SERVER} .badge") == "ready"
    assert "--port" in (page.text_content(f"{SERVER} .argv code") or "")

    os.kill(pid, signal.SIGKILL)
    down = page.wait_for_selector(f"{SERVER}:not([data-state='ready'])")
    assert down is not None
    state = down.get_attribute("data-state")
    assert state in ("restarting", "failed", "starting")
    badge = down.query_selector(".badge")
    assert badge is not None and badge.text_content() == state
    assert f"badge-state-{state}" in (badge.get_attribute("class") or "")

    page.wait_for_selector(f"{SERVER}[data-state='ready']", timeout=(RESTART_PAUSE_S + 10) * 1000)
    assert page.text_content(f"{SERVER} [data-field='restarts'] dd") == "1"
    assert int(page.get_attribute(SERVER, "data-pid") or 0) not in (0, pid)
    watched.assert_clean()


def test_a_pool_shows_each_replica_with_what_routing_knows_of_it(
    start_gateway: GatewayFactory, open_page: OpenPage, tmp_path: Path
) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    pool = {
        "provider": "local",
        "model_path": str(model),
        "replicas": 2,
        "server": {"cache_repair": False, "parallel": 2},
    }
    gw = start_gateway({"pool": pool}, llama_server_bin=str(write_binary(tmp_path)))
    gw.client("t").chat.completions.create(
        model="pool", messages=[{"role": "user", "content": "hello there"}]
    )
    watched = open_page(gw.url, "#models")
    page = watched.page
    servers = ".model-card[data-model='pool'] .server"
    page.wait_for_selector(f"{servers}[data-state='ready'] >> nth=1")
    heads = [page.text_content(f"{servers} >> nth={i} >> .server-head") or "" for i in (0, 1)]
    assert [h.split(":")[0].removeprefix("ready") for h in heads] == ["pool[0]", "pool[1]"]
    routing = [
        page.text_content(f"{servers} >> nth={i} >> [data-field='routing'] dd") or ""
        for i in (0, 1)
    ]
    assert all(r.startswith("up · 0 in flight · ") for r in routing), routing
    # the call's conversation is expected in one replica's cache
    assert sorted(r.split(" · ")[2].split(" ")[0] for r in routing) == ["0", "1"]
    watched.assert_clean()
