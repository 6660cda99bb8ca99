"""A profile of several llama-servers, served: each task stays on the server that holds
its conversation, a dead server's tasks move (``failover``), a server that comes back
takes new tasks, and a server whose slots are all taken sheds a task to an idle one
(``rebalanced``). The servers are fakes, each with its own prompt cache; the records say
which server answered each call."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from boundedcode_gateway.app import create_app
from boundedcode_gateway.config import parse_config
from boundedcode_gateway.llama_server import pool as pool_module
from tests.e2e.conftest import Gateway, GatewayFactory
from tests.fakes.common import Reply
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.llama_server_process import write_binary
from tests.fakes.server import serve_in_thread, stop_all
from tests.fakes.tcp_proxy import TcpProxy
from tests.lifespan import startup_report

# the fakes' probe is quick: a test waits for the gateway to see a server go or come back
PROBE_EVERY_S = 0.2
TURNS = 3


class Servers:
    """Two fake llama-servers of one model, each with its own cache, each reached through a
    TCP proxy that the test cuts (the server is dead: connections reset, new ones
    refused) and restores (it is back, its cache empty)."""

    def __init__(self) -> None:
        # slots for every task of the test: a miss is the routing's, never an eviction
        self.fakes = [FakeLlamaServer(total_slots=4) for _ in range(2)]
        self.running = [serve_in_thread(f.app) for f in self.fakes]
        self.proxies = [TcpProxy(target_port=r.port).start() for r in self.running]
        self.urls = [f"http://127.0.0.1:{p.port}" for p in self.proxies]

    def kill(self, i: int) -> None:
        self.proxies[i].cut()

    def start_again(self, i: int) -> None:
        self.fakes[i].reset_cache()
        self.proxies[i].restore()

    def stop(self) -> None:
        for proxy in self.proxies:
            proxy.stop()
        stop_all(self.running)


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[Servers]:
    monkeypatch.setattr(pool_module, "PROBE_EVERY_S", PROBE_EVERY_S)
    running = Servers()
    yield running
    running.stop()


def pool_gateway(
    start_gateway: GatewayFactory, servers: Servers, routing: str = "affinity"
) -> Gateway:
    # the repair's own calls would move what each cache holds between two turns
    entries = [{"external_url": u, "server": {"cache_repair": False}} for u in servers.urls]
    return start_gateway({"pool": {"provider": "local", "servers": entries, "routing": routing}})


def turn(gw: Gateway, task: str, messages: list[dict[str, Any]]) -> None:
    """One turn of a task's conversation: its answer is appended, and a new question."""
    answer = gw.client(task).chat.completions.create(model="pool", messages=messages)  # type: ignore[arg-type]
    messages.append({"role": "assistant", "content": answer.choices[0].message.content})
    messages.append({"role": "user", "content": f"and then, {task}? ({len(messages)})"})


def conversations(tasks: list[str]) -> dict[str, list[dict[str, Any]]]:
    return {
        t: [
            {"role": "system", "content": f"You are the agent of {t}. " + "Be brief. " * 40},
            {"role": "user", "content": f"Start {t}."},
        ]
        for t in tasks
    }


def by_task(calls: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for call in calls:
        out[call["task"]].append(call)
    return out


def wait_for_state(gw: Gateway, server: str, state: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        shown = httpx.get(gw.url + "/v1/models/pool").json()["servers"]
        if {s["name"]: s["state"] for s in shown}[server] == state:
            return
        assert time.monotonic() < deadline, f"{server} is not {state}: {shown}"
        time.sleep(0.05)


def test_tasks_stay_on_their_server_and_are_served_from_its_cache(
    start_gateway: GatewayFactory, servers: Servers
) -> None:
    gw = pool_gateway(start_gateway, servers)
    chats = conversations([f"t{i}" for i in range(4)])
    for _ in range(TURNS):
        for task, messages in chats.items():
            turn(gw, task, messages)
    calls = by_task(gw.calls())
    homes = {task: {c["server"] for c in calls[task]} for task in chats}
    assert all(len(h) == 1 for h in homes.values()), homes
    # new tasks spread over the pool
    assert Counter(next(iter(h)) for h in homes.values()) == Counter(servers.urls * 2)
    for task in chats:
        first, *later = calls[task]
        assert first["miss_cause"] == "first_call"
        assert all(c["miss_cause"] == "none" and c["cached_tokens"] > 0 for c in later), later
    # the ledger keeps which server answered
    rows = gw.ledger_rows()
    assert {r["call_id"]: r["server"] for r in rows} == {
        c["call_id"]: c["server"] for c in gw.calls()
    }
    model = httpx.get(gw.url + "/v1/models/pool").json()
    assert model["servers"] == [{"name": u, "state": "ready"} for u in servers.urls]


def test_a_dead_servers_tasks_fail_over_and_a_server_back_takes_new_tasks(
    start_gateway: GatewayFactory, servers: Servers
) -> None:
    gw = pool_gateway(start_gateway, servers)
    chats = conversations([f"t{i}" for i in range(4)])
    for task, messages in chats.items():
        turn(gw, task, messages)
    first = {c["task"]: c["server"] for c in gw.calls()}
    dead = servers.urls[0]
    moved = [t for t, s in first.items() if s == dead]
    assert moved
    # killed between two turns: the next call finds it refusing, before the probe does
    servers.kill(0)
    for task, messages in chats.items():
        turn(gw, task, messages)
    second = {c["task"]: c for c in gw.calls()[len(chats) :]}
    assert all(c["status"] == "ok" for c in second.values())
    for task in chats:
        call = second[task]
        assert call["server"] == servers.urls[1]
        if task in moved:
            assert call["miss_cause"] == "failover", call
            # the moved task's conversation was read again in full, once
            assert call["evaluated_tokens"] > call["prompt_tokens"] // 2, call
        else:
            assert call["miss_cause"] == "none", call
    # the next turn of a moved task is served from its new server's cache
    for task in moved:
        turn(gw, task, chats[task])
    third = gw.calls()[2 * len(chats) :]
    assert all(c["miss_cause"] == "none" and c["server"] == servers.urls[1] for c in third)
    wait_for_state(gw, dead, "down")
    servers.start_again(0)
    wait_for_state(gw, dead, "ready")
    fresh = conversations(["n0", "n1"])
    for task, messages in fresh.items():
        turn(gw, task, messages)
    newest = gw.calls()[-2:]
    assert [c["server"] for c in newest] == [dead, dead]
    assert all(c["status"] == "ok" for c in gw.calls())


def test_a_call_whose_server_dies_before_its_answer_goes_to_another(
    start_gateway: GatewayFactory, servers: Servers
) -> None:
    gw = pool_gateway(start_gateway, servers)
    chats = conversations(["t0"])
    turn(gw, "t0", chats["t0"])
    home = gw.calls()[0]["server"]
    index = servers.urls.index(home)
    # the server is slow to answer, and dies before its first content event
    servers.fakes[index].queue(Reply("late", delay_ms=3000))
    killer = threading.Timer(0.5, servers.kill, (index,))
    killer.start()
    client = gw.client("t0")
    stream: Any = client.chat.completions.create(
        model="pool",
        messages=chats["t0"],  # type: ignore[arg-type]
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    killer.join()
    assert text and text != "late"
    call = gw.calls()[-1]
    assert call["status"] == "ok"
    assert call["server"] != home
    assert call["miss_cause"] == "failover"
    assert call["retried"] is True


def test_a_server_with_every_slot_taken_sheds_a_task_to_an_idle_one(
    start_gateway: GatewayFactory, servers: Servers
) -> None:
    gw = pool_gateway(start_gateway, servers)
    for fake in servers.fakes:
        # answers that hold a slot for seconds (as the fakes' timings tell it): waiting
        # for a slot costs more than reading the conversation again elsewhere
        fake.predicted_ms_per_token = 1000.0
    chats = conversations(["t0"])
    turn(gw, "t0", chats["t0"])
    home = gw.calls()[0]["server"]
    index = servers.urls.index(home)
    # other clients of the server hold every slot, as its /slots shows
    servers.fakes[index].busy_elsewhere = True
    deadline = time.monotonic() + 10
    while True:
        shown = httpx.get(gw.url + "/v1/models/pool").json()
        if shown["servers"][index]["state"] == "ready" and _busy(gw, index):
            break
        assert time.monotonic() < deadline, "the probe did not see the busy slots"
        time.sleep(0.05)
    turn(gw, "t0", chats["t0"])
    call = gw.calls()[-1]
    assert call["server"] != home
    assert call["miss_cause"] == "rebalanced"


def _busy(gw: Gateway, index: int) -> bool:
    state = gw.app.fleets["pool"].pool.members[index].state
    return bool(state.busy)


def test_round_robin_moves_tasks_and_says_so(
    start_gateway: GatewayFactory, servers: Servers
) -> None:
    gw = pool_gateway(start_gateway, servers, routing="round_robin")
    chats = conversations(["t0"])
    for _ in range(TURNS):
        turn(gw, "t0", chats["t0"])
    calls = gw.calls()
    assert [c["server"] for c in calls] == [servers.urls[0], servers.urls[1], servers.urls[0]]
    assert [c["miss_cause"] for c in calls] == ["first_call", "rebalanced", "rebalanced"]


def test_managed_replicas_run_as_one_pool_and_a_killed_one_starts_again(
    start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    gw = start_gateway(
        {
            "pool": {
                "provider": "local",
                "model_path": str(model),
                "replicas": 2,
                "server": {"cache_repair": False, "parallel": 2},
            }
        },
        llama_server_bin=str(write_binary(tmp_path)),
    )
    names = ["pool[0]", "pool[1]"]
    model_shown = httpx.get(gw.url + "/v1/models/pool").json()
    assert model_shown["servers"] == [{"name": n, "state": "ready"} for n in names]
    chats = conversations(["t0", "t1"])
    for task, messages in chats.items():
        turn(gw, task, messages)
    homes = {c["task"]: c["server"] for c in gw.calls()}
    assert sorted(homes.values()) == names
    killed: Any = gw.app.fleets["pool"].pool.members[0].managed
    pid = killed.pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not (killed.restarts == 1 and killed.ready):
        assert time.monotonic() < deadline, "the replica did not start again"
        time.sleep(0.05)
    assert killed.pid != pid
    for task, messages in chats.items():
        turn(gw, task, messages)
    later = gw.calls()[len(chats) :]
    assert all(c["status"] == "ok" for c in later)
    # the restarted replica's cache is empty: its task is read again in full there or
    # elsewhere, never counted as served from a cache it lost
    moved = next(c for c in later if c["task"] == homes_task(homes, "pool[0]"))
    assert moved["miss_cause"] in ("server", "failover"), moved
    assert moved["evaluated_tokens"] > moved["prompt_tokens"] // 2
    ready = httpx.get(gw.url + "/ready").json()
    assert ready["models"]["pool"] == {"ready": True}


def homes_task(homes: dict[str, str], server: str) -> str:
    return next(task for task, home in homes.items() if home == server)


async def test_servers_that_disagree_on_props_stop_the_start(
    servers: Servers, tmp_path: Path
) -> None:
    servers.fakes[1].n_ctx = 8192
    entries = [{"external_url": u} for u in servers.urls]
    text = yaml.safe_dump(
        {"data_dir": str(tmp_path), "models": {"pool": {"provider": "local", "servers": entries}}}
    )
    failed = await startup_report(create_app(parse_config(text)))
    assert failed["type"] == "lifespan.startup.failed"
    assert (
        f"models.pool: the servers of a pool must run the same model alike, but {servers.urls[1]}"
        in failed["message"]
    )
