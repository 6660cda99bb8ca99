"""Growth and retention on a running gateway: many task ids leave bounded state in memory, an
active conversation's reasoning still goes back after its task was forgotten, idle task
folders are removed at start, and the call log is rotated."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson

from boundedcode_gateway.metering.calllog import log_files, read_calls
from boundedcode_gateway.reasoning_store.store import ReasoningStore
from tests.e2e.conftest import GatewayFactory, Upstreams
from tests.e2e.test_reasoning_history import TURNS
from tests.fakes.common import Reply

HELLO: list[Any] = [{"role": "user", "content": "hello"}]


def test_many_task_ids_leave_bounded_state(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(upstreams.profiles, retention={"tasks_in_memory": 5})
    for i in range(40):
        upstreams.llama.queue(Reply(content="ok", reasoning_content=f"thought {i}"))
        gateway.client(task=f"task-{i}").chat.completions.create(model="local", messages=HELLO)
    shared = gateway.app.service._shared
    assert len(shared.history) <= 5
    assert len(shared.continuity) <= 5
    store = gateway.app.reasoning
    assert isinstance(store, ReasoningStore)
    assert store.tasks_in_memory <= 5
    assert len(store._loading) == 0
    # every task's reasoning is still on disk (the last lines may still be on their way)
    deadline = time.monotonic() + 10
    while len(list((gateway.data_dir / "tasks").iterdir())) < 40:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_forgotten_tasks_reasoning_still_goes_back(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    """Two conversations, and a crowd of other tasks between each of their turns: every
    earlier answer goes back with its own reasoning, read again from the task's folder."""
    gateway = start_gateway(upstreams.profiles, retention={"tasks_in_memory": 2})
    histories: dict[str, list[Any]] = {
        task: [{"role": "user", "content": "Start the work."}] for task in ("a", "b")
    }
    crowd = 0
    for turn in TURNS:
        for task, history in histories.items():
            upstreams.llama.queue(turn)
            reply = gateway.client(task=task).chat.completions.create(
                model="local", messages=history
            )
            message = reply.choices[0].message
            sent: dict[str, Any] = {"role": "assistant", "content": message.content}
            if message.tool_calls:
                sent["tool_calls"] = [tc.model_dump() for tc in message.tool_calls]
                history += [
                    sent,
                    {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "r"},
                ]
            else:
                history += [sent, {"role": "user", "content": "Go on."}]
            for _ in range(3):  # pushes both conversations out of memory
                upstreams.llama.queue(Reply(content="noise", reasoning_content="noise"))
                gateway.client(task=f"crowd-{crowd}").chat.completions.create(
                    model="local", messages=HELLO
                )
                crowd += 1
    assert gateway.app.reasoning.tasks_in_memory <= 2
    posts = [r.body for r in upstreams.llama.requests if r.method == "POST"]
    conversation = [
        b["messages"] for b in posts if b["messages"][0]["content"] == "Start the work."
    ]
    assert len(conversation) == 2 * len(TURNS)
    thoughts = {t.reasoning_content for t in TURNS}
    for messages in conversation[2:]:
        answers = [m for m in messages if m["role"] == "assistant"]
        assert answers and all(m.get("reasoning_content") in thoughts for m in answers)


def test_idle_task_folders_are_removed_at_start(
    upstreams: Upstreams, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    data_dir = tmp_path / "kept"
    tasks = data_dir / "tasks"
    for name, age_days in (("stale", 45), ("recent", 2)):
        (tasks / name).mkdir(parents=True)
        path = tasks / name / "local-replay.jsonl"
        path.write_bytes(orjson.dumps({"key": "k", "provider": "local", "profile": "p", "data": 1}))
        then = time.time() - age_days * 86400
        os.utime(path, (then, then))
    gateway = start_gateway(upstreams.profiles, data_dir=str(data_dir), retention={"task_days": 30})
    deadline = time.monotonic() + 10
    while (tasks / "stale").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not (tasks / "stale").exists()
    assert (tasks / "recent").exists()
    gateway.client(task="recent").chat.completions.create(model="local", messages=HELLO)


def test_the_call_log_rotates_while_serving(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(
        upstreams.profiles, retention={"call_log_mib": 0.004, "call_log_files": 2}
    )
    client = gateway.client(task="rotating")
    for _ in range(30):
        client.chat.completions.create(model="gpt", messages=HELLO)
        assert gateway.app.writer.flush(5.0)
    files = log_files(gateway.data_dir / "calls.jsonl")
    assert [f.name for f in files] == ["calls.jsonl.2", "calls.jsonl.1", "calls.jsonl"]
    kept = read_calls(gateway.data_dir / "calls.jsonl")
    assert 3 <= len(kept) < 30 and len(gateway.ledger_rows()) == 30
