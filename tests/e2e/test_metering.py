"""Every call gets one call-log line and one ledger row, field by field, over a conversation."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import (
    ChatCompletionMessageParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionUserMessageParam,
)

from boundedcode_gateway.metering.records import CALL_LOG_ONLY, RECORD_FIELDS
from tests.e2e.conftest import Gateway, Upstreams
from tests.fakes.common import Reply, parse_sse

SYSTEM: ChatCompletionSystemMessageParam = {
    "role": "system",
    "content": "You are a careful coding agent. " * 20,
}


def timings_of(reply: Any) -> dict[str, Any]:
    extra = reply.model_extra or {}
    return extra["timings"]  # type: ignore[no-any-return]


def assert_measured_like(record: dict[str, Any], reply: Any) -> None:
    usage = reply.usage
    timings = timings_of(reply)
    assert record["prompt_tokens"] == usage.prompt_tokens
    assert record["completion_tokens"] == usage.completion_tokens
    assert record["cached_tokens"] == usage.prompt_tokens_details.cached_tokens
    assert record["evaluated_tokens"] == timings["prompt_n"]
    assert record["prefill_ms"] == timings["prompt_ms"]
    assert record["decode_ms"] == timings["predicted_ms"]
    assert record["reasoning_tokens"] is None  # llama.cpp does not report it


def test_conversation_on_llama(gateway: Gateway, upstreams: Upstreams) -> None:
    fake = upstreams.llama
    fake.queue(
        Reply(content="I will read the file.", reasoning_content="The user wants a fix."),
        Reply(content="Fixed it.", reasoning_content="Apply the patch now."),
        Reply(content="Summary noted.", reasoning_content="Short."),
        Reply(content="Streaming the last answer.", reasoning_content="Stream it."),
    )
    client = gateway.client(task="task-42")
    user1: ChatCompletionUserMessageParam = {
        "role": "user",
        "content": "Fix the failing test in parser.py please.",
    }
    first = client.chat.completions.create(model="local", messages=[SYSTEM, user1])
    # the reasoning goes back as llama.cpp reads it, a field the SDK's types do not have
    answer1: Any = {
        "role": "assistant",
        "content": first.choices[0].message.content,
        "reasoning_content": (first.choices[0].message.model_extra or {})["reasoning_content"],
    }
    user2: ChatCompletionUserMessageParam = {"role": "user", "content": "Now run the tests."}
    turn2: list[ChatCompletionMessageParam] = [SYSTEM, user1, answer1, user2]
    second = client.chat.completions.create(model="local", messages=turn2)
    summary: ChatCompletionUserMessageParam = {
        "role": "user",
        "content": "Summary: the parser test was fixed.",
    }
    turn3: list[ChatCompletionMessageParam] = [SYSTEM, summary, user2]
    third = client.chat.completions.create(model="local", messages=turn3)
    stream = list(
        gateway.client(task="task-42").chat.completions.create(
            model="local",
            messages=[
                *turn3,
                {"role": "assistant", "content": "Summary noted."},
                {"role": "user", "content": "Go on."},
            ],
            stream=True,
            stream_options={"include_usage": True},
        )
    )

    calls = gateway.calls()
    assert [c["call_id"] for c in calls] == [r["call_id"] for r in gateway.ledger_rows()]
    assert len(calls) == 4 and len({c["call_id"] for c in calls}) == 4
    for c in calls:
        assert set(c) == set(RECORD_FIELDS)
        assert c["task"] == "task-42" and c["purpose"] == "agent_turn"
        assert c["model_profile"] == "local" and c["provider"] == "local"
        assert c["upstream_model"] == first.model  # as the upstream reports it
        assert c["status"] == "ok" and c["http_status"] == 200 and c["error_code"] is None
        assert c["retried"] is False and c["attempts"] == 1
        assert c["started_at"].endswith("Z")
        assert c["total_ms"] > 0
    one, two, three, four = calls
    assert_measured_like(one, first)
    assert_measured_like(two, second)
    assert_measured_like(three, third)
    # the first call evaluates everything; the second reads its prefix from the cache
    assert one["cached_tokens"] == 0 and one["evaluated_tokens"] == one["prompt_tokens"]
    assert two["cached_tokens"] > one["prompt_tokens"]
    assert two["evaluated_tokens"] < one["evaluated_tokens"] / 4
    # the rewrite changed message 1, and the cache missed from there on
    assert (one["messages"], two["messages"], three["messages"]) == (2, 4, 3)
    assert (one["changed"], two["changed"], three["changed"]) == (-1, -1, 1)
    assert three["evaluated_tokens"] > two["evaluated_tokens"]
    assert not one["stream"] and four["stream"]
    # a whole answer's TTFT comes from the server's timings, a stream's is measured
    assert one["ttft_derived"] is True and one["ttft_ms"] is not None
    assert four["ttft_derived"] is False and 0 < four["ttft_ms"] <= four["total_ms"]
    # each miss named: the rewrite at message 1, nothing else missed
    causes = [(c["miss_cause"], c["miss_at"]) for c in calls]
    assert causes == [
        ("first_call", None),
        ("none", None),
        ("history_rewrite", {"message": 1}),
        ("none", None),
    ]
    assert two["reusable_tokens"] == one["prompt_tokens"] + one["completion_tokens"]
    assert four["changed"] == -1 and four["messages"] == 5
    usage = stream[-1].usage
    assert usage is not None and four["prompt_tokens"] == usage.prompt_tokens
    assert four["prefill_ms"] is not None and four["decode_ms"] is not None
    assert four["finish_reason"] == "stop"


def test_ledger_row_equals_call_log_line(gateway: Gateway, upstreams: Upstreams) -> None:
    client = gateway.client(task="t")
    client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    lines = gateway.calls()
    rows = gateway.ledger_rows()
    assert len(lines) == len(rows) == 2
    for line, row in zip(lines, rows, strict=True):
        for name in CALL_LOG_ONLY:  # the call log's detail; the ledger keeps the outcome
            line.pop(name)
        assert {k: (bool(v) if k in ("stream", "retried") else v) for k, v in row.items()} == line
    assert rows[1]["status"] == "error" and rows[1]["http_status"] == 404


def test_openai_usage_details(gateway: Gateway, upstreams: Upstreams) -> None:
    long_system: ChatCompletionSystemMessageParam = {
        "role": "system",
        "content": "Rules of the repository. " * 400,
    }
    upstreams.openai.queue(
        Reply(content="A.", reasoning_content="thinking " * 30),
        Reply(content="B.", reasoning_content="more " * 10),
    )
    client = gateway.client(purpose="planner")
    client.chat.completions.create(
        model="gpt", messages=[long_system, {"role": "user", "content": "plan"}]
    )
    reply = client.chat.completions.create(
        model="gpt",
        messages=[
            long_system,
            {"role": "user", "content": "plan"},
            {"role": "assistant", "content": "A."},
            {"role": "user", "content": "again"},
        ],
    )
    first, second = gateway.calls()
    assert first["purpose"] == "planner" and first["task"] == "default"
    assert first["provider"] == "openai" and first["upstream_model"] == "gpt-5.1"
    assert first["reasoning_tokens"] == 60
    assert first["cached_tokens"] == 0
    assert first["evaluated_tokens"] == first["prompt_tokens"]
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached > 1000 and second["cached_tokens"] == cached
    assert second["evaluated_tokens"] == second["prompt_tokens"] - second["cached_tokens"]
    assert second["prefill_ms"] is None and second["decode_ms"] is None


def test_purposes_are_diffed_apart(gateway: Gateway, upstreams: Upstreams) -> None:
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "one"}]
    gateway.client(task="t", purpose="agent_turn").chat.completions.create(
        model="local", messages=msgs
    )
    gateway.client(task="t", purpose="condenser").chat.completions.create(
        model="local", messages=[{"role": "user", "content": "summarise"}]
    )
    gateway.client(task="t", purpose="agent_turn").chat.completions.create(
        model="local", messages=[{"role": "user", "content": "two"}]
    )
    changed = [(c["purpose"], c["changed"]) for c in gateway.calls()]
    assert changed == [("agent_turn", -1), ("condenser", -1), ("agent_turn", 0)]


# a prompt of several progress batches; each attempt of the stream below breaks after two
# progress events, before any content and before usage
LONG_PROMPT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "word " * 300}]
BROKEN_AFTER_PROGRESS = Reply(content="never shown", break_after_chunks=2)


def test_a_stream_broken_before_usage_is_metered_from_its_progress(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    upstreams.llama.queue(BROKEN_AFTER_PROGRESS, BROKEN_AFTER_PROGRESS)
    broken = httpx.post(
        gateway.url + "/v1/chat/completions",
        timeout=10,
        json={"model": "local", "messages": LONG_PROMPT, "stream": True},
    )
    assert broken.status_code == 502
    upstreams.llama.reset_cache()
    whole = gateway.client().chat.completions.create(model="local", messages=LONG_PROMPT)
    record, answered = gateway.calls()
    assert record["error_code"] == "upstream_stream_broken" and record["attempts"] == 2
    assert record["completion_tokens"] is None  # no usage ever arrived
    # the prompt as the complete answer's usage counts it, known from the progress alone
    assert whole.usage is not None and answered["prompt_tokens"] == whole.usage.prompt_tokens
    assert record["prompt_tokens"] == whole.usage.prompt_tokens
    assert record["cached_tokens"] is not None
    assert record["evaluated_tokens"] == record["prompt_tokens"] - record["cached_tokens"]


def test_progress_the_caller_saw_is_what_was_metered(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    upstreams.llama.queue(BROKEN_AFTER_PROGRESS, BROKEN_AFTER_PROGRESS)
    resp = httpx.post(
        gateway.url + "/v1/chat/completions",
        timeout=10,
        json={"model": "local", "messages": LONG_PROMPT, "stream": True, "return_progress": True},
    )
    events = parse_sse(resp.content)
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    assert len(progress) == 4  # two per attempt; the resend's come after a discard chunk
    assert events[-1]["error"]["code"] == "upstream_stream_broken"
    last = progress[-1]
    record = gateway.calls()[0]
    assert (record["prompt_tokens"], record["cached_tokens"]) == (last["total"], last["cache"])
    assert record["evaluated_tokens"] == last["total"] - last["cache"]
    assert record["completion_tokens"] is None
