"""The cache keeper against the fake llama-server: each miss named, the repair, and that the
repair never holds a caller up."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply, tokenize

REASONING = "Think about it first."
SPLIT_ANSWER = (
    "It doubles the table when resizing, then moves every entry into its new bucket, "
    "one after another, in the order of the old buckets."
)
# where "resizing" starts in the answer's turn as generated and as rendered
SPLIT_AT = len(f"<think>\n{REASONING}\n</think>\n\nIt doubles the table when ")


def start(
    start_gateway: GatewayFactory, upstreams: Upstreams, repair: bool, **extra: Any
) -> Gateway:
    local = upstreams.profiles["local"]
    profile = {**local, "server": {"cache_repair": repair}, **extra}
    return start_gateway({"local": profile})


def converse(
    gw: Gateway,
    upstreams: Upstreams,
    replies: list[Reply],
    task: str = "t",
    settle: bool = True,
    **extra: Any,
) -> list[dict[str, Any]]:
    """One call per reply, as a bounded-mode caller sends them (no reasoning sent back)."""
    client = gw.client(task=task)
    history: list[Any] = []
    for i, reply in enumerate(replies):
        upstreams.llama.queue(reply)
        history.append({"role": "user", "content": f"question {i}"})
        answer = client.chat.completions.create(
            model="local", messages=history, extra_body=extra or None
        )
        history.append({"role": "assistant", "content": answer.choices[0].message.content})
        if settle:
            gw.settle()
    return gw.calls(repairs=True)


def of(calls: list[dict[str, Any]], purpose: str) -> list[dict[str, Any]]:
    return [c for c in calls if c["purpose"] == purpose]


def assert_ledger_agrees(gw: Gateway) -> None:
    """The ledger names every miss as the call log does."""
    fields = ("call_id", "miss_cause", "reusable_tokens")
    logged = sorted(tuple(c[f] for f in fields) for c in gw.calls(repairs=True))
    assert sorted(tuple(r[f] for f in fields) for r in gw.ledger_rows(repairs=True)) == logged


def split_turns() -> list[Reply]:
    return [Reply(content=SPLIT_ANSWER, reasoning_content=REASONING), Reply(content="Fine.")]


def test_a_token_split_is_named_where_it_happened(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    upstreams.llama.split_words = {"resizing"}
    gw = start(start_gateway, upstreams, repair=False)
    one, two = converse(gw, upstreams, split_turns())
    assert one["miss_cause"] == "first_call"
    assert two["miss_cause"] == "token_split"
    assert two["miss_at"] == {"message": 1, "char": SPLIT_AT}
    assert_ledger_agrees(gw)
    # the rest of the answer was evaluated again
    new_tokens = two["prompt_tokens"] - two["reusable_tokens"]
    assert two["evaluated_tokens"] > new_tokens + 8


def test_the_repair_evaluates_the_split_before_the_next_call(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    upstreams.llama.split_words = {"resizing"}
    gw = start(start_gateway, upstreams, repair=True)
    calls = converse(gw, upstreams, split_turns())
    _, two = of(calls, "agent_turn")
    repairs = of(calls, "cache_repair")
    assert two["miss_cause"] == "none"
    assert two["evaluated_tokens"] <= two["prompt_tokens"] - two["reusable_tokens"] + 8
    # each answer got its repair; the first found and mended the split
    assert len(repairs) == 2 and all(r["status"] == "ok" for r in repairs)
    first = repairs[0]
    assert (first["miss_cause"], first["miss_at"]) == (
        "token_split",
        {"message": 1, "char": SPLIT_AT},
    )
    assert first["task"] == "t" and first["model_profile"] == "local"
    assert first["evaluated_tokens"] > 8 and first["completion_tokens"] == 0
    assert repairs[1]["miss_cause"] == "none"
    # metered in the ledger as well
    rows = gw.ledger_rows(repairs=True)
    assert [r["purpose"] for r in rows].count("cache_repair") == 2
    assert sum(r["evaluated_tokens"] for r in rows) == sum(c["evaluated_tokens"] for c in calls)


def test_without_splits_the_repair_reads_only_the_tail(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start(start_gateway, upstreams, repair=True)
    replies = [Reply(content=SPLIT_ANSWER, reasoning_content=REASONING) for _ in range(3)]
    calls = converse(gw, upstreams, replies)
    assert [c["miss_cause"] for c in of(calls, "agent_turn")] == ["first_call", "none", "none"]
    tail = len(tokenize("<|im_end|>\n<|im_start|>user\n"))
    for repair in of(calls, "cache_repair"):
        assert repair["miss_cause"] == "none"
        assert repair["evaluated_tokens"] <= tail  # the turn's end and the next header


def test_dropped_reasoning_is_named(upstreams: Upstreams, start_gateway: GatewayFactory) -> None:
    gw = start(start_gateway, upstreams, repair=False, reasoning_history="drop")
    _, two = converse(gw, upstreams, split_turns())
    # the reasoning block's opening stays; its text is where the rendering departs
    at = {"message": 1, "char": len("<think>\n")}
    assert (two["miss_cause"], two["miss_at"]) == ("reasoning_dropped", at)
    assert_ledger_agrees(gw)


def test_a_template_that_renders_the_turn_anew_is_named(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    """Earlier turns lose their reasoning block once a new user message follows."""
    gw = start(start_gateway, upstreams, repair=False)
    kwargs = {"preserve_reasoning": False}
    _, two = converse(gw, upstreams, split_turns(), chat_template_kwargs=kwargs)
    assert (two["miss_cause"], two["miss_at"]) == ("template_render", {"message": 1, "char": 0})
    assert_ledger_agrees(gw)


def test_a_server_that_lost_its_cache(upstreams: Upstreams, start_gateway: GatewayFactory) -> None:
    gw = start(start_gateway, upstreams, repair=False)
    client = gw.client(task="t")
    upstreams.llama.queue(Reply(content="one"), Reply(content="two"))
    history: list[Any] = [{"role": "user", "content": "hello"}]
    answer = client.chat.completions.create(model="local", messages=history)
    gw.settle()
    upstreams.llama.reset_cache()
    history += [{"role": "assistant", "content": answer.choices[0].message.content}]
    history += [{"role": "user", "content": "again"}]
    client.chat.completions.create(model="local", messages=history)
    two = gw.calls()[1]
    assert (two["miss_cause"], two["miss_at"], two["cached_tokens"]) == ("server", None, 0)
    assert_ledger_agrees(gw)


def test_without_the_slots_text_no_cause_is_guessed(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    """A server run without LLAMA_SERVER_SLOTS_DEBUG shows no generated text: a split is
    then the server's as far as the gateway can prove."""
    upstreams.llama.split_words = {"resizing"}
    upstreams.llama.slots_debug = False
    gw = start(start_gateway, upstreams, repair=False)
    _, two = converse(gw, upstreams, split_turns())
    assert two["miss_cause"] == "server" and two["miss_at"] is None


def test_a_busy_server_gets_no_repair(upstreams: Upstreams, start_gateway: GatewayFactory) -> None:
    upstreams.llama.busy_elsewhere = True
    gw = start(start_gateway, upstreams, repair=True)
    calls = converse(gw, upstreams, split_turns())
    assert of(calls, "cache_repair") == []
    assert not any(r.path == "/completion" for r in upstreams.llama.cache_requests)


def test_a_call_arriving_abandons_the_repair(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    """The repair holds the server's only slot for 5 s; the next call does not wait for it."""
    upstreams.llama.completion_delay_ms = 5000
    gw = start(start_gateway, upstreams, repair=True)
    client = gw.client(task="t")
    upstreams.llama.queue(*split_turns())
    history: list[Any] = [{"role": "user", "content": "hello"}]
    answer = client.chat.completions.create(model="local", messages=history)
    wait_for(lambda: any(r.path == "/completion" for r in upstreams.llama.cache_requests))
    history += [{"role": "assistant", "content": answer.choices[0].message.content}]
    history += [{"role": "user", "content": "again"}]
    began = time.monotonic()
    client.chat.completions.create(model="local", messages=history)
    waited = time.monotonic() - began
    gw.settle()
    calls = gw.calls(repairs=True)
    repairs = of(calls, "cache_repair")
    # the gateway's own work gave way: not a failure, and not counted as one
    assert repairs[0]["status"] == "abandoned" and repairs[0]["error_code"] == "abandoned"
    assert repairs[0]["http_status"] == 499
    exposition = gw.app.metrics.exposition()[0].decode()
    assert 'code="",model="local",purpose="cache_repair",status="499"} 1.0' in exposition
    assert 'code="abandoned"' not in exposition
    assert waited < 5.0, waited  # it did not queue behind the repair's slot


def wait_for(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


@pytest.mark.parametrize("stream", [False, True])
def test_streamed_and_whole_answers_are_followed_alike(
    upstreams: Upstreams, start_gateway: GatewayFactory, stream: bool
) -> None:
    """A streamed tool-call answer is rebuilt whole for the repair's rendering."""
    upstreams.llama.split_words = {"resizing"}
    gw = start(start_gateway, upstreams, repair=True)
    client = gw.client(task="t")
    call = {"name": "resize", "arguments": '{"when": "resizing"}', "id": "call_1"}
    upstreams.llama.queue(Reply(content="", reasoning_content=REASONING, tool_calls=[call]))
    history: list[Any] = [{"role": "user", "content": "go"}]
    if stream:
        events = list(client.chat.completions.create(model="local", messages=history, stream=True))
        args = "".join(
            (t.function.arguments or "") if t.function else ""
            for e in events
            if e.choices
            for t in e.choices[0].delta.tool_calls or ()
        )
    else:
        reply = client.chat.completions.create(model="local", messages=history)
        tool_calls = reply.choices[0].message.tool_calls or []
        args = tool_calls[0].function.arguments  # type: ignore[union-attr]
    gw.settle()
    assert args == '{"when": "resizing"}'
    history.append(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "resize", "arguments": args},
                }
            ],
        }
    )
    history.append({"role": "tool", "tool_call_id": "call_1", "content": "done"})
    upstreams.llama.queue(Reply(content="Done."))
    client.chat.completions.create(model="local", messages=history)
    calls = gw.calls(repairs=True)
    [first_repair, *_] = of(calls, "cache_repair")
    assert first_repair["miss_cause"] == "token_split"
    assert of(calls, "agent_turn")[1]["miss_cause"] == "none"


def test_threads_do_not_share_a_conversation(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    """Two tasks at once: each call is compared with its own task's previous call."""
    gw = start(start_gateway, upstreams, repair=False)
    errors: list[BaseException] = []

    def run(task: str) -> None:
        try:
            converse(gw, upstreams, [Reply(content="a b c"), Reply(content="d e f")], task=task)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    for task in ("x", "y"):
        causes = [c["miss_cause"] for c in gw.calls() if c["task"] == task]
        assert causes[0] == "first_call" and len(causes) == 2


def test_a_restarted_gateway_goes_on_with_each_conversation(
    upstreams: Upstreams, start_gateway: GatewayFactory, tmp_path: Any
) -> None:
    # the previous calls are read back from the call log: after a restart the next call
    # is compared with the last one before it, the repair's rendering included
    data_dir = tmp_path / "kept"
    local = {**upstreams.profiles["local"], "server": {"cache_repair": True}}
    first = start_gateway({"local": local}, data_dir=data_dir)
    replies = [Reply(content=SPLIT_ANSWER, reasoning_content=REASONING) for _ in range(3)]
    history: list[Any] = []
    gw = first
    for i, reply in enumerate(replies):
        if i == 2:
            first.calls()  # written out, as a gateway that stops writes out what it metered
            first.server.stop()
            gw = start_gateway({"local": local}, data_dir=data_dir)
        upstreams.llama.queue(reply)
        history.append({"role": "user", "content": f"question {i}"})
        answer = gw.client(task="t").chat.completions.create(model="local", messages=history)
        history.append({"role": "assistant", "content": answer.choices[0].message.content})
        gw.settle()
    turns = of(gw.calls(repairs=True), "agent_turn")
    assert [c["miss_cause"] for c in turns] == ["first_call", "none", "none"]
    repairs = of(gw.calls(repairs=True), "cache_repair")
    assert turns[2]["reusable_tokens"] == repairs[1]["prompt_tokens"]
