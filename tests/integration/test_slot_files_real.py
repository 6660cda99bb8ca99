"""A task's prompt cache survives what happens to its server, on the real pinned
llama-server with SmolLM2: after the server is killed and started again, after the
gateway itself is stopped and started again, after its server of a pool fails, and
after another task took the only slot, the task's next call evaluates only its new
tokens (within the template's tail and 2 % of the prompt) and its record says how many
were restored (docs/llama-server.md, "Slot files")."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from boundedcode_gateway.llama_server import pool as pool_module
from boundedcode_gateway.llama_server.slot_store import SLOT_FILES_FOLDER
from boundedcode_gateway.policy.cache_misses import MISS_TOLERANCE_TOKENS
from tests.e2e.conftest import Gateway
from tests.integration.conftest import MODEL, start_real_gateway

# a system prompt of some 700 tokens: its evaluation is what a restore saves
SYSTEM = (
    "You are a coding agent working in a repository of a small web service. "
    "Read the files you are given, change only what the task asks, run the tests. "
) * 20
SERVER = {"ctx_size": 4096, "parallel": 1}
# a saved slot is written once the conversation has been idle this long
IDLE_SAVE_S = 0.3


@pytest.fixture(autouse=True)
def quick_saves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "SAVE_CHECK_EVERY_S", 0.1)


def profile(**server: Any) -> dict[str, Any]:
    return {"provider": "local", "model_path": MODEL, "server": {**SERVER, **server}}


def start(data_dir: Path, profiles: dict[str, Any], managed: bool = True) -> Gateway:
    return start_real_gateway(
        data_dir, profiles, managed, prompt_cache={"idle_save_s": IDLE_SAVE_S}
    )


def ask(gw: Gateway, task: str, messages: list[dict[str, Any]], model: str = "smol") -> None:
    """One turn: the answer and a new question appended; the keeper's follow-up done."""
    resp = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": model, "messages": messages, "max_tokens": 8, "temperature": 0},
        headers={"X-BoundedCode-Task": task},
        timeout=600,
    )
    assert resp.status_code == 200, resp.text
    gw.settle()
    messages.append(
        {"role": "assistant", "content": resp.json()["choices"][0]["message"]["content"]}
    )
    messages.append({"role": "user", "content": f"Now step {len(messages)}: run the tests."})


def conversation(task: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Task {task}."}]


def wait_saved(gw: Gateway, count: int = 1) -> None:
    deadline = time.monotonic() + 60
    while len(list((gw.data_dir / SLOT_FILES_FOLDER).glob("*.slot"))) < count:
        assert time.monotonic() < deadline, "the idle slot was not saved"
        time.sleep(0.1)


def assert_restored(before: dict[str, Any], after: dict[str, Any]) -> None:
    """``after`` found all of ``before``'s conversation in the restored slot: it evaluated
    only what is new, within the template's tail and 2 % of its prompt."""
    assert after["status"] == "ok", after
    assert after["restored_tokens"] and after["restored_tokens"] >= before["prompt_tokens"], after
    new = after["prompt_tokens"] - before["prompt_tokens"] - before["completion_tokens"]
    slack = MISS_TOLERANCE_TOKENS + after["prompt_tokens"] * 2 // 100
    assert after["evaluated_tokens"] <= new + slack, (before, after)
    assert after["restore_failure"] is None, after


def test_a_killed_server_started_again_gets_the_task_back(tmp_path: Path) -> None:
    gw = start(tmp_path, {"smol": profile()})
    try:
        chat = conversation("a")
        ask(gw, "a", chat)
        wait_saved(gw)
        server: Any = gw.app.fleets["smol"].managed
        os.kill(server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while not (server.restarts == 1 and server.ready):
            assert time.monotonic() < deadline, "llama-server did not start again"
            time.sleep(0.1)
        ask(gw, "a", chat)
        first, second = gw.calls()
        assert first["evaluated_tokens"] > 500  # what the restore saved
        assert_restored(first, second)
    finally:
        gw.stop()


def test_a_restarted_gateway_and_a_task_that_lost_the_slot_get_it_back(tmp_path: Path) -> None:
    gw = start(tmp_path, {"smol": profile()})
    a, b = conversation("a"), conversation("b")
    try:
        ask(gw, "a", a)
        ask(gw, "b", b)  # the only slot goes to b: a's is saved first
        ask(gw, "a", a)
        first_a, _, second_a = gw.calls()
        assert_restored(first_a, second_a)
        assert gw.calls()[1]["slot_save_ms"] is not None
    finally:
        gw.stop()  # a's slot is saved before its server stops
    again = start(tmp_path, {"smol": profile()})
    try:
        ask(again, "a", a)
        third_a = again.calls()[-1]
        assert_restored(second_a, third_a)
    finally:
        again.stop()


def test_a_task_whose_server_fails_is_restored_on_another_of_its_pool(tmp_path: Path) -> None:
    pool = {
        "provider": "local",
        "model_path": MODEL,
        "replicas": 2,
        "server": SERVER,
    }
    gw = start(tmp_path, {"pool": pool}, managed=False)
    try:
        chat = conversation("a")
        ask(gw, "a", chat, model="pool")
        home = gw.calls()[0]["server"]
        wait_saved(gw)
        member = next(m for m in gw.app.fleets["pool"].pool.members if m.state.name == home)
        dead: Any = member.managed
        dead._stopping = True  # gone for good, as a host taken away
        os.kill(dead.pid, signal.SIGKILL)
        ask(gw, "a", chat, model="pool")
        first, second = gw.calls()
        assert second["server"] != home
        assert_restored(first, second)
    finally:
        gw.stop()
