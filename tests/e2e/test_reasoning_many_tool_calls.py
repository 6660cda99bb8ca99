"""One answer with 512 KiB of reasoning and 400 tool calls, through the gateway to the fake
llama-server (and to the fake Anthropic API, as thinking): its reasoning is stored once
(the replay file, or the state database, grows by about one copy, not one per tool call),
the gateway's memory grows by far less than 400 copies, and the next turn, on the same
gateway, a restarted one or another on the same database, gets the reasoning back for its
tool calls."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.e2e.conftest import Gateway, GatewayFactory
from tests.fakes.anthropic_api import AnthropicReply, FakeAnthropic
from tests.fakes.common import Reply
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import serve_in_thread
from tests.memory import GROWTH_LIMIT, PeakRss
from tests.postgres_db import PgDatabase

TOOL_CALLS = 400
# 512 KiB of reasoning, in words that vary (nothing a compressor or an interner could fold)
REASONING = "".join(f"step {i} of the plan reads file f{i % 997}.py; " for i in range(15_000))[
    : 512 * 1024
]
IDS = [f"call_{i:04d}" for i in range(TOOL_CALLS)]
CALLS = [{"id": i, "name": "read_file", "arguments": {"path": f"src/{i}.py"}} for i in IDS]
# what the gateway may grow by for the one answer (400 copies of its reasoning made it
# grow by 200 MiB)
TASK = "wide"
QUESTION: list[dict[str, Any]] = [{"role": "user", "content": "Read every file."}]


@pytest.fixture
def llama() -> Iterator[tuple[FakeLlamaServer, str]]:
    # a context that holds the next turn (the reasoning sent back, 400 tool results), and
    # streamed chunks of many tokens, so the fake's own pace stays out of the way
    fake = FakeLlamaServer(n_ctx=1 << 22, tokens_per_chunk=4096, predicted_ms_per_token=0.01)
    with serve_in_thread(fake.app) as server:
        yield fake, server.url


def start(start_gateway: GatewayFactory, url: str, **settings: Any) -> Gateway:
    profile = {"provider": "local", "external_url": url, "server": {"cache_repair": False}}
    return start_gateway({"local": profile}, **settings)


def post(client: httpx.Client, gw: Gateway, messages: list[Any], stream: bool) -> dict[str, Any]:
    """One call of the task; the answer's message (a stream's deltas put together)."""
    body = {"model": "local", "messages": messages, "stream": stream}
    headers = {"X-BoundedCode-Task": TASK}
    url = gw.url + "/v1/chat/completions"
    if not stream:
        resp = client.post(url, json=body, headers=headers)
        assert resp.status_code == 200, resp.text
        message: dict[str, Any] = resp.json()["choices"][0]["message"]
        return message
    content, calls = "", dict[int, dict[str, str]]()
    with client.stream("POST", url, json=body, headers=headers) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in orjson.loads(line[6:])["choices"]:
                delta = choice["delta"]
                content += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    held = calls.setdefault(call["index"], {"id": "", "name": "", "args": ""})
                    held["id"] += call.get("id") or ""
                    function = call.get("function") or {}
                    held["name"] += function.get("name") or ""
                    held["args"] += function.get("arguments") or ""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["args"]},
            }
            for c in calls.values()
        ],
    }


def next_turn(answer: dict[str, Any]) -> list[Any]:
    """The history a bounded-mode caller sends next: the answer without its reasoning, and
    a result for each tool call."""
    sent = {k: v for k, v in answer.items() if k != "reasoning_content"}
    results = [
        {"role": "tool", "tool_call_id": c["id"], "content": f"contents of {c['id']}"}
        for c in answer["tool_calls"]
    ]
    return [*QUESTION, sent, *results]


def reasoning_sent_back(fake: FakeLlamaServer) -> list[Any]:
    last = [r for r in fake.requests if r.method == "POST"][-1].body["messages"]
    return [m.get("reasoning_content") for m in last if m["role"] == "assistant"]


def settle_files(gw: Gateway) -> None:
    """Until the lines queued for the replay files are written."""
    store: Any = gw.app.reasoning
    appender = getattr(store, "_appender", None)
    if appender is not None:
        appender.run(lambda: None).result(30)


def replay_bytes(gw: Gateway) -> int:
    path = gw.data_dir / "tasks" / TASK / "local-replay.jsonl"
    return path.stat().st_size if path.exists() else 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_one_answer_with_many_tool_calls_stores_its_reasoning_once(
    start_gateway: GatewayFactory, llama: tuple[FakeLlamaServer, str], stream: bool
) -> None:
    fake, url = llama
    gw = start(start_gateway, url)
    fake.queue(Reply(content="", reasoning_content=REASONING, tool_calls=CALLS))
    with httpx.Client(timeout=120) as client:
        client.get(gw.url + "/health")  # the gateway's own first-use costs, before measuring
        with PeakRss() as rss:
            answer = post(client, gw, QUESTION, stream)
            settle_files(gw)
        grew = replay_bytes(gw)
        print(
            f"{'streamed' if stream else 'whole'}: replay file {grew:,} bytes, "
            f"+{rss.growth / (1 << 20):.1f} MiB"
        )
        assert [c["id"] for c in answer["tool_calls"]] == IDS
        assert len(REASONING.encode()) <= grew < 2 * len(REASONING.encode())
        assert rss.growth < GROWTH_LIMIT, f"grew by {rss.growth / (1 << 20):.0f} MiB"

        fake.queue(Reply(content="Read them all."))
        post(client, gw, next_turn(answer), stream)
        assert reasoning_sent_back(fake) == [REASONING]

        # a restarted gateway reads the one copy back, and finds it under each tool call
        again = start(start_gateway, url, data_dir=gw.data_dir)
        for call_id in (IDS[0], IDS[-1]):
            only_one = {
                **answer,
                "tool_calls": [c for c in answer["tool_calls"] if c["id"] == call_id],
            }
            fake.queue(Reply(content="Read it."))
            post(client, again, next_turn(only_one), stream)
            assert reasoning_sent_back(fake) == [REASONING]


def test_one_answer_with_many_tool_calls_is_one_row_in_the_state_database(
    pg: PgDatabase, start_gateway: GatewayFactory, llama: tuple[FakeLlamaServer, str]
) -> None:
    fake, url = llama
    gw = start(start_gateway, url, state=pg.url)
    fake.queue(Reply(content="", reasoning_content=REASONING, tool_calls=CALLS))
    with httpx.Client(timeout=120) as client:
        client.get(gw.url + "/health")
        with PeakRss() as rss:
            answer = post(client, gw, QUESTION, stream=False)
        rows = pg.fetch(
            "SELECT count(*) AS n, coalesce(sum(octet_length(data)), 0) AS bytes "
            "FROM state_reasoning WHERE task = $1",
            TASK,
        )
        print(
            f"state database: {rows[0]['n']} rows, {rows[0]['bytes']:,} bytes, "
            f"+{rss.growth / (1 << 20):.1f} MiB"
        )
        assert rows[0]["n"] == 1
        assert len(REASONING.encode()) <= rows[0]["bytes"] < 2 * len(REASONING.encode())
        assert rss.growth < GROWTH_LIMIT, f"grew by {rss.growth / (1 << 20):.0f} MiB"

        # another gateway on the same database finds it under each tool call
        other = start(start_gateway, url, state=pg.url)
        for call_id in (IDS[0], IDS[-1]):
            only_one = {
                **answer,
                "tool_calls": [c for c in answer["tool_calls"] if c["id"] == call_id],
            }
            fake.queue(Reply(content="Read it."))
            post(client, other, next_turn(only_one), stream=False)
            assert reasoning_sent_back(fake) == [REASONING]


ANTHROPIC_KEY = "sk-ant-test-0123456789"


def test_one_answer_with_many_tool_uses_stores_its_thinking_once(
    start_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same through Anthropic's thinking blocks, which the fake refuses a tool loop
    without: one line of 512 KiB for 400 tool uses, and the next turn passes."""
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", ANTHROPIC_KEY)
    fake = FakeAnthropic(api_key=ANTHROPIC_KEY, context_window=1 << 22)
    with serve_in_thread(fake.app) as server, httpx.Client(timeout=120) as client:
        profile = {
            "provider": "anthropic",
            "model": "claude-sonnet-4-5",
            "base_url": server.url + "/v1",
            "api_key_env": "TEST_ANTHROPIC_KEY",
            "thinking": {"budget_tokens": 2048},
            "max_tokens": 8192,
        }
        gw = start_gateway({"claude": profile})
        fake.queue(AnthropicReply(reasoning_content=REASONING, tool_calls=CALLS))
        client.get(gw.url + "/health")
        body = {"model": "claude", "messages": QUESTION}
        headers = {"X-BoundedCode-Task": TASK}
        url = gw.url + "/v1/chat/completions"
        with PeakRss() as rss:
            resp = client.post(url, json=body, headers=headers)
            assert resp.status_code == 200, resp.text
            settle_files(gw)
        path = gw.data_dir / "tasks" / TASK / "anthropic-thinking.jsonl"
        grew = path.stat().st_size
        print(f"anthropic: thinking file {grew:,} bytes, +{rss.growth / (1 << 20):.1f} MiB")
        answer = resp.json()["choices"][0]["message"]
        assert [c["id"] for c in answer["tool_calls"]] == IDS
        assert len(REASONING.encode()) <= grew < 2 * len(REASONING.encode())
        assert rss.growth < GROWTH_LIMIT, f"grew by {rss.growth / (1 << 20):.0f} MiB"

        fake.queue(AnthropicReply(content="Read them all."))
        body = {"model": "claude", "messages": next_turn(answer)}
        resp = client.post(url, json=body, headers=headers)
        assert resp.status_code == 200, resp.text  # the thinking went back: not refused
        sent = fake.requests.bodies("/v1/messages")[-1]["messages"]
        [turn] = [m for m in sent if m["role"] == "assistant"]
        assert turn["content"][0] == {**turn["content"][0], "thinking": REASONING}
