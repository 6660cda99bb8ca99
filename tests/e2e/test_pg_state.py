"""Two gateways on one PostgreSQL database (``state:`` and ``ledger:``) serving one task in
turn: the caller drops each answer's reasoning, and every turn still goes upstream with all
of it, whichever gateway kept it; ``changed`` is what one gateway reports; the ledger has
one row per call. A state database cut mid-run holds no call up."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from boundedcode_gateway.database.pool import RETRY_AFTER_S
from boundedcode_gateway.operations.metrics import PREFIX
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply
from tests.fakes.tcp_proxy import TcpProxy
from tests.postgres_db import SERVER_PORT, PgDatabase

SYSTEM = {"role": "system", "content": "You are a coding agent. " * 10}
CONDENSED = {"role": "system", "content": "You are a coding agent; be brief. " * 6}

TURNS = [
    Reply(content="I will look at the parser.", reasoning_content="The bug is in parse. " * 8),
    Reply(
        content="",
        reasoning_content="Read the file first. " * 8,
        tool_calls=[{"id": "call_read", "name": "read_file", "arguments": '{"path": "p.py"}'}],
    ),
    Reply(content="Found it.", reasoning_content="Line 12 is wrong. " * 8),
    Reply(
        content="",
        reasoning_content="Run the tests now. " * 8,
        tool_calls=[{"id": "call_run", "name": "run_tests", "arguments": "{}"}],
    ),
    Reply(content="Fixed.", reasoning_content="Now it parses. " * 8),
    Reply(content="Done.", reasoning_content="All tests pass. " * 8),
]
# before this turn the caller rewrites its system message (a condenser would): `changed` 0
REWRITE_AT = 4


@dataclass
class Conversation:
    """A bounded-mode caller: it sends each answer back without its reasoning."""

    task: str
    history: list[Any] = field(
        default_factory=lambda: [SYSTEM, {"role": "user", "content": "Fix the parser."}]
    )

    def turn(self, gateway: Gateway, n: int) -> None:
        if n == REWRITE_AT:
            self.history[0] = CONDENSED
        client = gateway.client(task=self.task)
        if n % 2:  # every other turn streamed: its end waits for what it kept as well
            content = ""
            calls: dict[int, dict[str, str]] = {}
            stream = client.chat.completions.create(
                model="local", messages=self.history, stream=True
            )
            for chunk in stream:
                for choice in chunk.choices:
                    content += choice.delta.content or ""
                    for call in choice.delta.tool_calls or []:
                        held = calls.setdefault(call.index, {"id": "", "name": "", "args": ""})
                        held["id"] += call.id or ""
                        if call.function is not None:
                            held["name"] += call.function.name or ""
                            held["args"] += call.function.arguments or ""
            tool_calls = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["args"]},
                }
                for c in calls.values()
            ]
        else:
            message = (
                client.chat.completions.create(model="local", messages=self.history)
                .choices[0]
                .message
            )
            content = message.content or ""
            tool_calls = [tc.model_dump() for tc in message.tool_calls or []]
        sent: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            sent["tool_calls"] = tool_calls
            result = {"role": "tool", "tool_call_id": tool_calls[0]["id"], "content": f"ok {n}"}
            self.history += [sent, result]
        else:
            self.history += [sent, {"role": "user", "content": f"Go on with step {n + 2}."}]


def upstream_histories(upstreams: Upstreams, since: int = 0) -> list[list[dict[str, Any]]]:
    posts = [r.body for r in upstreams.llama.requests if r.method == "POST"]
    return [b["messages"] for b in posts[since:] if "messages" in b]


def reasoning_sent(messages: list[dict[str, Any]]) -> list[str | None]:
    return [m.get("reasoning_content") for m in messages if m["role"] == "assistant"]


def changed_of(calls: list[dict[str, Any]], task: str) -> list[int | None]:
    ours = sorted((c for c in calls if c["task"] == task), key=lambda c: c["started_at"])
    return [c["changed"] for c in ours]


@pytest.mark.parametrize("settings", ["one-database", "state-and-ledger"])
def test_two_gateways_serving_one_task_in_turn_keep_its_reasoning_and_changed(
    pg: PgDatabase, upstreams: Upstreams, start_gateway: GatewayFactory, settings: str
) -> None:
    # `database:` alone, or the older separate settings
    shared = {"database": pg.url}
    if settings == "state-and-ledger":
        shared = {"state": pg.url, "ledger": pg.url}
    gateways = [start_gateway(upstreams.profiles, **shared) for _ in range(2)]
    upstreams.llama.queue(*TURNS)
    conversation = Conversation("shared")
    for n in range(len(TURNS)):
        conversation.turn(gateways[n % 2], n)

    sent = upstream_histories(upstreams)
    assert len(sent) == len(TURNS)
    for n, messages in enumerate(sent):
        # every earlier answer went back with its own reasoning, whichever gateway kept it
        assert reasoning_sent(messages) == [t.reasoning_content for t in TURNS[:n]]
    calls = sorted(gateways[0].calls() + gateways[1].calls(), key=lambda c: c["started_at"])
    assert [c["status"] for c in calls] == ["ok"] * len(TURNS)
    # so the server's cache served every turn but the rewritten one
    for n, call in enumerate(calls[1:], start=1):
        if n != REWRITE_AT:
            assert call["evaluated_tokens"] < 40, calls
    across_two = changed_of(calls, "shared")
    assert across_two == [-1, -1, -1, -1, 0, -1]

    # one gateway with its state in files and memory reports the same
    alone = start_gateway(upstreams.profiles)
    before = len(upstream_histories(upstreams))
    upstreams.llama.queue(*TURNS)
    again = Conversation("alone")
    for n in range(len(TURNS)):
        again.turn(alone, n)
    assert changed_of(alone.calls(), "alone") == across_two
    assert [reasoning_sent(m) for m in upstream_histories(upstreams, before)] == [
        reasoning_sent(m) for m in sent
    ]

    # the ledger holds each call of the two gateways exactly once
    rows = pg.fetch("SELECT call_id, changed FROM model_calls ORDER BY seq")
    assert sorted(r["call_id"] for r in rows) == sorted(c["call_id"] for c in calls)
    assert len(rows) == len({r["call_id"] for r in rows}) == len(TURNS)
    # nothing of the state went to the gateways' folders
    assert not any((g.data_dir / "tasks").exists() for g in gateways)
    items = pg.fetch("SELECT keys FROM state_reasoning WHERE task = 'shared'")
    assert len(items) == len(TURNS)


def scraped(gateway: Gateway) -> dict[str, float]:
    body = httpx.get(gateway.url + "/metrics", timeout=10).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == f"{PREFIX}_state_database_up":
                found["up"] = sample.value
            if sample.name == f"{PREFIX}_state_unavailable_operations_total":
                found[sample.labels["operation"]] = sample.value
    return found


def test_calls_go_on_while_the_state_database_is_cut_off(
    pg: PgDatabase, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    proxy = TcpProxy(target_port=SERVER_PORT).start()
    try:
        cut_off = start_gateway(upstreams.profiles, state=pg.url_at(proxy.port), ledger=pg.url)
        direct = start_gateway(upstreams.profiles, state=pg.url, ledger=pg.url)
        upstreams.llama.queue(*TURNS)
        conversation = Conversation("outage")
        conversation.turn(cut_off, 0)
        conversation.turn(cut_off, 1)
        proxy.cut()
        for n in (2, 3):
            started = time.monotonic()
            conversation.turn(cut_off, n)
            assert time.monotonic() - started < 5.0  # at most one statement's timeout
        found = scraped(cut_off)
        assert found["up"] == 0.0
        assert found["read_reasoning"] >= 1 and found["write_reasoning"] >= 1
        proxy.restore()
        time.sleep(RETRY_AFTER_S + 0.2)
        conversation.turn(cut_off, 4)
        assert scraped(cut_off)["up"] == 1.0
        conversation.turn(direct, 5)

        sent = upstream_histories(upstreams)
        # the gateway cut off still sent every earlier answer's reasoning: it held them
        for n in range(5):
            assert reasoning_sent(sent[n]) == [t.reasoning_content for t in TURNS[:n]]
        # the other gateway has what reached the database: not what was kept during the cut
        thoughts = [t.reasoning_content for t in TURNS]
        assert reasoning_sent(sent[5]) == [thoughts[0], thoughts[1], None, None, thoughts[4]]
        changed = changed_of(cut_off.calls() + direct.calls(), "outage")
        assert changed == [-1, -1, None, None, 0, -1]  # turn 4 compared with turn 1's request
        assert len(pg.fetch("SELECT call_id FROM model_calls")) == len(TURNS)
    finally:
        proxy.stop()
