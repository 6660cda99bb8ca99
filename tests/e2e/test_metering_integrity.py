"""Metering integrity end to end: an upstream's absurd usage costs no other caller its record,
and with ``metering.sync`` a call is in the call log and the ledger before its answer ends."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import openai
import pytest

from boundedcode_gateway.json_values import MAX_COUNT
from boundedcode_gateway.metering.calllog import read_calls
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.canned import CannedUpstream, canned_answer

HELLO: list[Any] = [{"role": "user", "content": "hello"}]
U64_MAX = 2**64 - 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_absurd_usage_is_clamped_and_costs_no_one_else_their_record(
    canned: CannedUpstream, upstreams: Upstreams, start_gateway: GatewayFactory, stream: bool
) -> None:
    poison = {"prompt_tokens": U64_MAX, "completion_tokens": 10**30, "total_tokens": U64_MAX}
    canned.answers.extend(canned_answer(usage=poison) for _ in range(3))
    gateway = start_gateway({**upstreams.profiles, **canned.profiles()})
    errors: list[BaseException] = []

    def call(model: str, task: str) -> None:
        try:
            client = gateway.client(task=task)
            if stream:
                chunks = client.chat.completions.create(
                    model=model,
                    messages=HELLO,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                assert list(chunks)
            else:
                assert client.chat.completions.create(model=model, messages=HELLO).choices
        except BaseException as exc:  # reported below, from the test's own thread
            errors.append(exc)

    threads = [threading.Thread(target=call, args=("canned", f"poisoned-{i}")) for i in range(3)]
    threads += [threading.Thread(target=call, args=("local", f"other-{i}")) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    tasks = sorted(c["task"] for c in gateway.calls())
    assert tasks == sorted([f"poisoned-{i}" for i in range(3)] + [f"other-{i}" for i in range(6)])
    assert sorted(r["task"] for r in gateway.ledger_rows()) == tasks
    for row in gateway.ledger_rows():
        if row["task"].startswith("poisoned"):
            assert row["prompt_tokens"] == MAX_COUNT
            assert row["completion_tokens"] is None  # 10**30 reads as a float: not a count
    assert gateway.app.writer.set_aside == 0


def ledger_tasks(data_dir: Path) -> list[str]:
    """The ledger as another process sees it now, without waiting for the writer."""
    path = data_dir / "ledger.db"
    if not path.exists():
        return []
    with closing(sqlite3.connect(path)) as db:
        return [r[0] for r in db.execute("SELECT task FROM model_calls ORDER BY rowid")]


def logged_tasks(data_dir: Path) -> list[str]:
    return [c["task"] for c in read_calls(data_dir / "calls.jsonl")]


@pytest.fixture
def sync_gateway(upstreams: Upstreams, start_gateway: GatewayFactory) -> Gateway:
    return start_gateway(upstreams.profiles, metering={"enabled": True, "sync": True})


@pytest.mark.parametrize("model", ["local", "gpt"])
def test_sync_a_whole_answer_is_recorded_before_it_arrives(
    sync_gateway: Gateway, model: str
) -> None:
    for i in range(5):
        task = f"whole-{i}"
        sync_gateway.client(task=task).chat.completions.create(model=model, messages=HELLO)
        assert ledger_tasks(sync_gateway.data_dir)[-1] == task
        assert logged_tasks(sync_gateway.data_dir)[-1] == task


@pytest.mark.parametrize("model", ["local", "gpt"])
def test_sync_a_stream_is_recorded_before_its_done(sync_gateway: Gateway, model: str) -> None:
    for i in range(5):
        task = f"stream-{i}"
        stream = sync_gateway.client(task=task).chat.completions.create(
            model=model, messages=HELLO, stream=True
        )
        with stream:
            for _ in stream:
                pass  # the SDK stops at [DONE]: the answer's end as the caller sees it
            assert ledger_tasks(sync_gateway.data_dir)[-1] == task
            assert logged_tasks(sync_gateway.data_dir)[-1] == task


def test_sync_an_error_is_recorded_before_it_arrives(sync_gateway: Gateway) -> None:
    for i in range(3):
        task = f"missing-{i}"
        with pytest.raises(openai.NotFoundError):
            sync_gateway.client(task=task).chat.completions.create(
                model="no-such-model", messages=HELLO
            )
        assert ledger_tasks(sync_gateway.data_dir)[-1] == task
        assert logged_tasks(sync_gateway.data_dir)[-1] == task
