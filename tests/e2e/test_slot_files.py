"""Each conversation's slot saved to a file and restored wherever its next call goes
(docs/llama-server.md, "Slot files"), served by the gateway against fake llama-servers
that save and restore slots as the real one does: more conversations than slots, a
client's side requests between two turns on one slot, a managed server killed and
started again, the gateway itself started again, a failover; a file cut, changed, of
another model or not a slot file at all is refused by name and the call still
answered; a restore the server does not reuse is named and not tried again; the disk
budget holds over many tasks."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from boundedcode_gateway.llama_server import pool as pool_module
from boundedcode_gateway.llama_server.slot_store import SLOT_FILES_FOLDER
from tests.e2e.conftest import Gateway, GatewayFactory
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.llama_server_process import write_binary
from tests.fakes.server import RunningServer, serve_in_thread, stop_all

SYSTEM = "You are a careful coding agent. " + "Check each step twice. " * 60


class Server:
    """A fake llama-server of one slot that saves slots into a folder of its own."""

    def __init__(self, folder: Path, slots: int = 1) -> None:
        self.fake = FakeLlamaServer(total_slots=slots)
        folder.mkdir(parents=True, exist_ok=True)
        self.fake.slot_save_path = folder
        self.folder = folder
        self.running: RunningServer = serve_in_thread(self.fake.app)
        self.url = f"http://127.0.0.1:{self.running.port}"

    def profile(self) -> dict[str, Any]:
        # the repair's own evaluations would change what the slot holds between turns
        server = {"cache_repair": False, "slot_save_path": str(self.folder)}
        return {"provider": "local", "external_url": self.url, "server": server}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "server-slots")
    yield running
    stop_all([running.running])


def chat(system: str = SYSTEM, task: str = "t") -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Begin {task}."}]


def turn(gw: Gateway, task: str, messages: list[dict[str, Any]], model: str = "m") -> None:
    """One call of a conversation; its answer and a new question appended."""
    answer = gw.client(task).chat.completions.create(model=model, messages=messages)  # type: ignore[arg-type]
    messages.append({"role": "assistant", "content": answer.choices[0].message.content})
    messages.append({"role": "user", "content": f"Go on ({len(messages)})."})


def store_files(gw: Gateway) -> list[Path]:
    return sorted((gw.data_dir / SLOT_FILES_FOLDER).glob("*.slot"))


def test_a_conversation_evicted_from_the_slot_is_restored_and_reads_only_its_new_tokens(
    start_gateway: GatewayFactory, server: Server
) -> None:
    gw = start_gateway({"m": server.profile()})
    a, b = chat(task="a"), chat("Another agent. " * 80, "b")
    turn(gw, "a", a)
    turn(gw, "b", b)  # takes the one slot: a's is saved first
    turn(gw, "a", a)  # a's file is restored before its call
    first_a, first_b, second_a = gw.calls()
    assert first_b["slot_save_ms"] is not None and first_b["slot_save_ms"] >= 0
    # the save is a record of a's task: the gateway's own work, its tokens and time
    save, b_saved = gw.saves()  # a's when b took the slot, b's when a took it back
    assert (save["task"], save["status"], save["server"]) == ("a", "ok", server.url)
    assert b_saved["task"] == "b"
    tokens = first_a["prompt_tokens"] + first_a["completion_tokens"]
    assert save["adjustments"] == {"slot_tokens_saved": tokens}
    assert save["slot_save_ms"] is not None
    assert second_a["restored_tokens"] == first_a["prompt_tokens"] + first_a["completion_tokens"]
    assert second_a["slot_restore_ms"] is not None
    # only what is new since a's last answer is evaluated
    assert second_a["evaluated_tokens"] <= second_a["prompt_tokens"] - first_a["prompt_tokens"]
    assert second_a["miss_cause"] == "none", second_a
    assert "restore_failure" not in second_a or second_a["restore_failure"] is None
    # the ledger keeps the same figures
    rows = {r["call_id"]: r for r in gw.ledger_rows()}
    assert rows[second_a["call_id"]]["restored_tokens"] == second_a["restored_tokens"]
    # the file is in the store, the gateway user's alone, and nothing is left behind in
    # the server's folder
    saved = store_files(gw)
    assert saved and all(os.stat(p).st_mode & 0o777 == 0o600 for p in saved)
    # and /metrics counts them
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'gateway_slot_saves_total{model="m"} 2.0' in metrics
    assert 'gateway_slot_restores_total{model="m"} 1.0' in metrics
    assert 'gateway_slot_restores_ineffective_total{model="m"} 0.0' in metrics
    on_disk = sum(p.stat().st_size for p in saved)
    assert f"boundedcode_gateway_slot_files_bytes {float(on_disk)}" in metrics
    assert os.stat(saved[0].parent).st_mode & 0o777 == 0o700
    assert list(server.folder.iterdir()) == []


def test_a_side_request_between_two_turns_leaves_the_agents_slot_to_come_back(
    start_gateway: GatewayFactory, server: Server
) -> None:
    gw = start_gateway({"m": server.profile()})
    agent = chat()
    turn(gw, "t", agent)
    # a title request of the same task: its own first message, its own conversation
    title = chat("Write a 5-word title for the conversation.", "t")
    turn(gw, "t", title)
    turn(gw, "t", agent)
    first, side, second = gw.calls()
    assert side["restored_tokens"] is None  # nothing of its own to restore
    # the title's messages differ from the first: so does its prompt
    assert (side["miss_cause"], side["changed"]) == ("history_rewrite", 0)
    assert side["conversation"] != first["conversation"]
    assert second["restored_tokens"] and second["restored_tokens"] >= first["prompt_tokens"]
    assert second["evaluated_tokens"] <= second["prompt_tokens"] - first["prompt_tokens"]
    assert second["miss_cause"] == "none", second
    # and the title's next call finds its own slot state back too
    turn(gw, "t", title)
    assert gw.calls()[-1]["restored_tokens"]


def test_a_side_requests_new_question_is_a_diverged_prefix_and_restores_go_on(
    start_gateway: GatewayFactory, server: Server
) -> None:
    gw = start_gateway({"m": server.profile()})
    agent = chat()
    turn(gw, "t", agent)
    turn(gw, "t", chat("Write a 5-word title for the conversation.", "t"))
    turn(gw, "t", agent)
    # the next title request asks about something else: its file's prefix, no more
    turn(gw, "t", chat("Write a 5-word title for the conversation.", "t2"))
    title = gw.calls()[-1]
    # judged against its own first request's messages, not the agent's turn before it:
    # the server reused the restored prefix, so restores go on
    assert title["restored_tokens"] and title["restore_failure"] == "prefix_diverged", title
    turn(gw, "t", agent)
    last = gw.calls()[-1]
    assert last["restored_tokens"] and last["restore_failure"] is None, last
    files = gw.app.fleets["m"].pool.slot_files
    assert files is not None and files.counts.ineffective == 1


def test_without_slot_files_the_agents_turn_after_a_side_request_is_not_a_rewrite(
    start_gateway: GatewayFactory, server: Server
) -> None:
    gw = start_gateway({"m": server.profile()}, prompt_cache={"slot_files": False})
    agent = chat()
    turn(gw, "t", agent)
    title = chat("Write a 5-word title for the conversation.", "t")
    turn(gw, "t", title)
    turn(gw, "t", agent)
    turn(gw, "t", title)
    first, _, second, side = gw.calls()
    # the title took the only slot: the agent's history was not rewritten, it was evicted
    assert second["changed"] == 0 and second["miss_cause"] == "server", second
    assert second["reusable_tokens"] == first["prompt_tokens"] + first["completion_tokens"]
    # and the title's next call is compared with the title's first
    assert side["changed"] == 0 and side["miss_cause"] == "server", side


@pytest.mark.parametrize(
    ("spoil", "cause"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "cut"),
        (lambda p: p.write_bytes(p.read_bytes()[:-1] + b"X"), "corrupt"),
        (lambda p: p.write_bytes(b"GGUF" + p.read_bytes()[4:]), "foreign"),
    ],
    ids=["cut", "corrupt", "foreign"],
)
def test_a_spoiled_slot_file_is_refused_by_name_and_the_call_is_answered(
    start_gateway: GatewayFactory, server: Server, spoil: Any, cause: str
) -> None:
    gw = start_gateway({"m": server.profile()})
    a, b = chat(task="a"), chat("Another agent. " * 80, "b")
    turn(gw, "a", a)
    turn(gw, "b", b)
    (saved,) = store_files(gw)
    spoil(saved)
    turn(gw, "a", a)
    last = gw.calls()[-1]
    assert last["status"] == "ok"
    assert last["restore_failure"] == f"file_refused: {cause}", last
    assert last["miss_cause"] == "restore_ineffective"
    assert last["restored_tokens"] is None
    assert server.fake.restored == []  # never handed to the server
    # the refused file is gone: it is not refused again and again
    assert saved.name not in {p.name for p in store_files(gw)}


def test_a_file_saved_by_another_model_is_not_restored(
    start_gateway: GatewayFactory, server: Server
) -> None:
    gw = start_gateway({"m": server.profile()})
    a, b = chat(task="a"), chat("Another agent. " * 80, "b")
    turn(gw, "a", a)
    turn(gw, "b", b)
    # the server now runs another model file (as after an operator swapped it)
    server.fake.model_path = "/models/another.gguf"
    gw.app.fleets["m"].pool.members[0].slots.emptied(1)  # type: ignore[union-attr]
    files = gw.app.fleets["m"].pool.slot_files
    assert files is not None
    files.forget_identity(gw.app.fleets["m"].pool.members[0])
    turn(gw, "a", a)
    last = gw.calls()[-1]
    assert last["status"] == "ok"
    assert last["restore_failure"] == "file_refused: mismatched", last
    assert server.fake.restored == []


def test_a_restore_the_server_does_not_reuse_is_named_and_not_tried_again(
    start_gateway: GatewayFactory, server: Server
) -> None:
    server.fake.restore_ineffective = True
    gw = start_gateway({"m": server.profile()})
    a, b = chat(task="a"), chat("Another agent. " * 80, "b")
    turn(gw, "a", a)
    turn(gw, "b", b)
    turn(gw, "a", a)
    ineffective = gw.calls()[-1]
    assert ineffective["status"] == "ok"
    assert ineffective["restored_tokens"]
    assert ineffective["miss_cause"] == "restore_ineffective"
    assert ineffective["restore_failure"] == "reevaluated"
    assert len(server.fake.restored) == 1
    # b's turn takes the slot again, and a's next turn: no second blind restore
    turn(gw, "b", b)
    turn(gw, "a", a)
    assert len(server.fake.restored) == 1
    assert gw.calls()[-1]["restored_tokens"] is None
    shown = httpx.get(gw.url + "/v1/models/m").json()
    assert shown["slot_files"]["not_restoring"] == {server.url: "reevaluated"}
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'gateway_slot_restores_ineffective_total{model="m"} 1.0' in metrics


def test_the_disk_budget_holds_over_many_tasks(
    start_gateway: GatewayFactory, server: Server
) -> None:
    # each file of this fake is a few KiB: a budget of 24 KiB holds a handful
    budget = 24 * 1024
    gw = start_gateway({"m": server.profile()}, prompt_cache={"disk_mib": budget / 2**20})
    chats = {f"t{i}": chat(f"Agent number {i}. " * 60, f"t{i}") for i in range(30)}
    for task, messages in chats.items():
        turn(gw, task, messages)
        total = sum(p.stat().st_size for p in store_files(gw))
        assert total <= budget
    assert len(store_files(gw)) >= 2
    # the most recent conversations are the ones kept
    turn(gw, "t28", chats["t28"])
    assert gw.calls()[-1]["restored_tokens"]


def test_an_idle_conversation_is_saved_without_another_taking_its_slot(
    start_gateway: GatewayFactory, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "SAVE_CHECK_EVERY_S", 0.05)
    gw = start_gateway({"m": server.profile()}, prompt_cache={"idle_save_s": 0.2})
    turn(gw, "a", chat(task="a"))
    deadline = time.monotonic() + 10
    while not store_files(gw):
        assert time.monotonic() < deadline, "the idle slot was not saved"
        time.sleep(0.05)
    assert len(server.fake.saved) == 1
    time.sleep(0.5)
    assert len(server.fake.saved) == 1  # saved once: nothing new since


def test_slot_files_off_pin_and_save_nothing(start_gateway: GatewayFactory, server: Server) -> None:
    gw = start_gateway({"m": server.profile()}, prompt_cache={"slot_files": False})
    a, b = chat(task="a"), chat("Another agent. " * 80, "b")
    for _ in range(2):
        turn(gw, "a", a)
        turn(gw, "b", b)
    assert server.fake.saved == [] and server.fake.restored == []
    assert all(c["restored_tokens"] is None for c in gw.calls())


# -- managed servers: the gateway's own restart of a crashed server, and its own restart


def managed(tmp_path: Path, **server: Any) -> dict[str, Any]:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    settings = {"cache_repair": False, "parallel": 1, **server}
    return {"provider": "local", "model_path": str(model), "server": settings}


def test_a_crashed_managed_server_started_again_gets_its_tasks_slots_back(
    start_gateway: GatewayFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "SAVE_CHECK_EVERY_S", 0.05)
    gw = start_gateway(
        {"m": managed(tmp_path)},
        llama_server_bin=str(write_binary(tmp_path)),
        prompt_cache={"idle_save_s": 0.2},
    )
    a = chat(task="a")
    turn(gw, "a", a)
    deadline = time.monotonic() + 10
    while not store_files(gw):
        assert time.monotonic() < deadline, "the idle slot was not saved"
        time.sleep(0.05)
    server: Any = gw.app.fleets["m"].pool.members[0].managed
    pid = server.pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not (server.restarts == 1 and server.ready):
        assert time.monotonic() < deadline, "the server did not start again"
        time.sleep(0.05)
    turn(gw, "a", a)
    first, second = gw.calls()
    assert second["status"] == "ok"
    assert second["restored_tokens"] == first["prompt_tokens"] + first["completion_tokens"]
    assert second["evaluated_tokens"] <= second["prompt_tokens"] - first["prompt_tokens"]
    assert second["miss_cause"] == "none", second


def test_a_restarted_gateway_restores_what_the_stopped_one_saved(
    start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    profile = managed(tmp_path)
    binary = str(write_binary(tmp_path))
    data_dir = tmp_path / "data"
    gw = start_gateway({"m": profile}, llama_server_bin=binary, data_dir=data_dir)
    a = chat(task="a")
    turn(gw, "a", a)
    first = gw.calls()[0]
    gw.stop()  # a planned stop: the slot is saved before the server goes
    assert store_files(gw)
    again = start_gateway({"m": profile}, llama_server_bin=binary, data_dir=data_dir)
    turn(again, "a", a)
    second = again.calls()[-1]
    assert second["restored_tokens"] == first["prompt_tokens"] + first["completion_tokens"]
    assert second["evaluated_tokens"] <= second["prompt_tokens"] - first["prompt_tokens"]


def test_a_task_whose_server_fails_is_restored_on_the_other_server_of_its_pool(
    start_gateway: GatewayFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "SAVE_CHECK_EVERY_S", 0.05)
    monkeypatch.setattr(pool_module, "PROBE_EVERY_S", 0.2)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    gw = start_gateway(
        {
            "pool": {
                "provider": "local",
                "model_path": str(model),
                "replicas": 2,
                "server": {"cache_repair": False, "parallel": 1},
            }
        },
        llama_server_bin=str(write_binary(tmp_path)),
        prompt_cache={"idle_save_s": 0.2},
    )
    a = chat(task="a")
    turn(gw, "a", a, model="pool")
    home = gw.calls()[0]["server"]
    deadline = time.monotonic() + 10
    while not store_files(gw):
        assert time.monotonic() < deadline, "the idle slot was not saved"
        time.sleep(0.05)
    members = gw.app.fleets["pool"].pool.members
    dead: Any = next(m for m in members if m.state.name == home).managed
    # the server is stopped for good (its supervisor too), as a host taken away would be
    dead._stopping = True
    os.kill(dead.pid, signal.SIGKILL)
    turn(gw, "a", a, model="pool")
    first, second = gw.calls()
    assert second["server"] != home and second["status"] == "ok"
    assert second["restored_tokens"] == first["prompt_tokens"] + first["completion_tokens"]
    assert second["evaluated_tokens"] <= second["prompt_tokens"] - first["prompt_tokens"]


def looks_busy(state: Any) -> None:
    """A server of the pool taken to be busy with another client's long call (the pool's
    probe is off): a call of a conversation it holds goes to the other server."""
    state.others_busy = 1
    state.measured(0, None, 10**12)


def test_a_rebalanced_task_takes_its_newest_tokens_with_it_both_ways(
    start_gateway: GatewayFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no probe to correct what the test says of each server's load, no idle save
    monkeypatch.setattr(pool_module, "PROBE_EVERY_S", 3600.0)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    gw = start_gateway(
        {
            "pool": {
                "provider": "local",
                "model_path": str(model),
                "replicas": 2,
                "server": {"cache_repair": False, "parallel": 1},
            }
        },
        llama_server_bin=str(write_binary(tmp_path)),
        prompt_cache={"idle_save_s": 3600},
    )
    members = gw.app.fleets["pool"].pool.members
    a = chat(task="a")
    turn(gw, "a", a, model="pool")
    home = gw.calls()[0]["server"]
    x, y = sorted(members, key=lambda m: m.state.name != home)
    assert not store_files(gw)
    looks_busy(x.state)
    turn(gw, "a", a, model="pool")
    # the server it left is up: its slot is saved there before the restore here
    first, second = gw.calls()
    assert second["server"] == y.state.name
    assert second["slot_save_ms"] is not None
    assert second["restored_tokens"] == first["prompt_tokens"] + first["completion_tokens"]
    assert second["evaluated_tokens"] <= second["prompt_tokens"] - first["prompt_tokens"]
    x.state.others_busy = 0
    looks_busy(y.state)
    turn(gw, "a", a, model="pool")
    # back where its slot holds the first turn: the second's file is restored over it
    third = gw.calls()[2]
    assert third["server"] == x.state.name
    assert third["restored_tokens"] == second["prompt_tokens"] + second["completion_tokens"]
    assert third["evaluated_tokens"] <= third["prompt_tokens"] - second["prompt_tokens"]
    assert third["miss_cause"] == "none", third


def test_a_slot_the_caller_names_is_left_out_for_the_conversations_own(
    start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    two = Server(tmp_path / "two-slots", slots=2)
    try:
        gw = start_gateway({"m": two.profile()})
        client = gw.client("a")
        client.chat.completions.create(
            model="m",
            messages=chat(task="a"),  # type: ignore[arg-type]
            extra_body={"id_slot": 1},
        )
        sent = [r.raw_body for r in two.fake.requests if r.path == "/v1/chat/completions"]
        assert len(sent) == 1
        # the gateway's pin alone, first; the caller's is gone
        assert sent[0].startswith(b'{"id_slot":0,') and sent[0].count(b'"id_slot"') == 1
    finally:
        stop_all([two.running])


def test_a_server_whose_restores_buy_nothing_has_its_last_conversation_evaluated_after_a_restart(
    start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    profile = managed(tmp_path, cache_repair=True, extra_args=["--fake-restore-ineffective"])
    gw = start_gateway({"m": profile}, llama_server_bin=str(write_binary(tmp_path)))
    a, b = chat(task="a"), chat("Another agent. " * 80, "b")
    turn(gw, "a", a)
    turn(gw, "b", b)
    gw.settle()
    turn(gw, "a", a)  # restored, and evaluated again all the same
    gw.settle()
    assert gw.calls()[-1]["restore_failure"] == "reevaluated"
    member = gw.app.fleets["m"].pool.members[0]
    server: Any = member.managed
    os.kill(server.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    # started again: a, served last, is evaluated again in its slot while nothing comes
    while not any(
        c.get("adjustments", {}).get("evaluated_after_restart") and c["status"] == "ok"
        for c in gw.calls(repairs=True)
    ):
        assert time.monotonic() < deadline, "the last conversation was not evaluated again"
        time.sleep(0.05)
    rewarm = next(
        c for c in gw.calls(repairs=True) if c.get("adjustments", {}).get("evaluated_after_restart")
    )
    assert rewarm["task"] == "a" and rewarm["purpose"] == "cache_repair"
    before = gw.calls()[-1]
    turn(gw, "a", a)
    after = gw.calls()[-1]
    assert after["restored_tokens"] is None  # not restored: evaluated in the background
    assert after["evaluated_tokens"] <= after["prompt_tokens"] - before["prompt_tokens"], after


def test_retention_removes_the_slot_files_of_idle_tasks(
    start_gateway: GatewayFactory, server: Server, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    gw = start_gateway({"m": server.profile()}, data_dir=data_dir)
    a, b = chat(task="a"), chat("Another agent. " * 80, "b")
    turn(gw, "a", a)
    turn(gw, "b", b)
    gw.stop()
    kept = {p.name for p in store_files(gw)}
    assert len(kept) == 2  # a's, and b's saved before the stop
    # a's file was last used 40 days ago
    folder = data_dir / SLOT_FILES_FOLDER
    for about in folder.glob("*.json"):
        entry = orjson.loads(about.read_bytes())
        if entry["task"] == "a":
            entry["used_at"] -= 40 * 86400
            about.write_bytes(orjson.dumps(entry))
    again = start_gateway({"m": server.profile()}, data_dir=data_dir, retention={"task_days": 30})
    deadline = time.monotonic() + 10
    while len(store_files(again)) != 1:
        assert time.monotonic() < deadline, "the idle task's slot file was not removed"
        time.sleep(0.05)
    (left,) = store_files(again)
    about = orjson.loads(left.with_suffix(".json").read_bytes())
    assert about["task"] == "b"


def test_a_line_new_on_every_request_keeps_the_conversation_in_its_slot(
    start_gateway: GatewayFactory, server: Server
) -> None:
    """Claude Code's billing header changes on every request: it is not what tells one
    conversation from another, so the agent's turns stay in their slot, unsaved."""

    def system(nonce: int) -> str:
        return f"x-anthropic-billing-header: cc_version=2.1; cch={nonce:08x};\n{SYSTEM}"

    gw = start_gateway({"m": server.profile()})
    messages = chat(system(1))
    turn(gw, "t", messages)
    messages[0] = {"role": "system", "content": system(2)}
    turn(gw, "t", messages)
    assert server.fake.saved == [] and gw.saves() == []
    second = gw.calls()[-1]
    assert second["miss_cause"] == "none" and second["restored_tokens"] is None
