"""The gateway against the real pinned llama-server: capabilities, chat, metering, progress,
structured output, and every server key reaching the process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.e2e.conftest import Gateway
from tests.fakes.common import parse_sse
from tests.integration.conftest import ALL_KEYS, direct_get, managed_pid, server_url

QUESTION: list[Any] = [{"role": "user", "content": "Name three colours of the rainbow."}]


def caps(gw: Gateway, name: str) -> dict[str, Any]:
    return httpx.get(f"{gw.url}/v1/models/{name}", timeout=10).json()["capabilities"]  # type: ignore[no-any-return]


def test_capabilities_from_real_props(real: Gateway) -> None:
    smol = caps(real, "smol")
    assert smol["source"] == "props"
    # SmolLM2's template renders neither tools nor earlier reasoning
    assert smol["reasoning_back"] is False and smol["tools"] is False
    assert smol["prompt_progress"] is True and smol["vision"] is False
    # no multimodal projector: neither audio nor video; and no URLs for the server to fetch
    assert smol["audio"] is False and smol["video"] is False and smol["media_urls"] is False
    assert smol["context_tokens"] == 8192
    reasoner = caps(real, "reasoner")
    assert reasoner["source"] == "props" and reasoner["reasoning_back"] is True


def test_reasoning_reaches_a_template_that_renders_it(real: Gateway) -> None:
    history: list[Any] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "greet the user back"},
        {"role": "user", "content": "again"},
    ]
    client = real.client()
    with_reasoning = client.chat.completions.create(
        model="reasoner", messages=history, max_tokens=1
    )
    stripped: list[Any] = [
        {k: v for k, v in m.items() if k != "reasoning_content"} for m in history
    ]
    without = client.chat.completions.create(model="reasoner", messages=stripped, max_tokens=1)
    assert with_reasoning.usage is not None and without.usage is not None
    assert with_reasoning.usage.prompt_tokens > without.usage.prompt_tokens + 4


def test_conversation_is_metered_from_real_timings(real: Gateway) -> None:
    client = real.client(task="real-conversation")
    system: Any = {"role": "system", "content": "You answer briefly. " + "Context line. " * 150}
    first = client.chat.completions.create(
        model="smol", messages=[system, *QUESTION], max_tokens=24
    )
    answer = first.choices[0].message.content
    assert answer
    turn2: list[Any] = [
        system,
        *QUESTION,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And two more?"},
    ]
    chunks = list(
        client.chat.completions.create(model="smol", messages=turn2, max_tokens=24, stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    one, two = [c for c in real.calls() if c["task"] == "real-conversation"]
    # a cold prompt: at most the template's opening tokens are shared with earlier calls
    assert one["prompt_tokens"] > 400
    assert one["evaluated_tokens"] >= one["prompt_tokens"] - 8
    assert one["prefill_ms"] > 0 and one["decode_ms"] > 0
    assert one["completion_tokens"] == first.usage.completion_tokens  # type: ignore[union-attr]
    # the second turn reads the first from the server's cache
    assert two["prompt_tokens"] > one["prompt_tokens"]
    assert two["cached_tokens"] >= one["prompt_tokens"] - 1
    assert two["evaluated_tokens"] < two["prompt_tokens"] / 5
    assert two["stream"] is True and 0 < two["ttft_ms"] <= two["total_ms"]
    assert two["changed"] == -1


def test_progress_only_for_callers_who_asked(real: Gateway) -> None:
    long_user = [{"role": "user", "content": "Summarise: " + "the quick brown fox " * 120}]
    body = {"model": "smol", "messages": long_user, "max_tokens": 4, "stream": True}
    asked = httpx.post(
        real.url + "/v1/chat/completions", timeout=60, json={**body, "return_progress": True}
    )
    events = [e for e in parse_sse(asked.content) if isinstance(e, dict)]
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    assert progress, "no progress chunks reached the caller who asked"
    assert set(progress[0]) >= {"total", "cache", "processed", "time_ms"}
    assert progress[-1]["processed"] == progress[-1]["total"]
    plain = httpx.post(
        real.url + "/v1/chat/completions",
        timeout=60,
        json={**body, "messages": [{"role": "user", "content": "Hello!"}]},
    )
    assert not any("prompt_progress" in e for e in parse_sse(plain.content) if isinstance(e, dict))
    # the gateway metered the plain call from the progress it asked for anyway
    call = real.calls()[-1]
    assert call["evaluated_tokens"] is not None and call["prompt_tokens"] > 0


SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"type": "string", "maxLength": 20},
        "count": {"type": "integer"},
    },
    "required": ["colour", "count"],
    "additionalProperties": False,
}


def test_json_schema_reply_matches(real: Gateway) -> None:
    reply = real.client().chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Give a colour and a count as JSON."}],
        max_tokens=120,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "colour_count", "schema": SCHEMA, "strict": True},
        },
    )
    data = orjson.loads(reply.choices[0].message.content or "")
    assert list(data) == ["colour", "count"]
    assert isinstance(data["colour"], str) and len(data["colour"]) <= 20
    assert isinstance(data["count"], int)


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def _environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(p.split("=", 1) for p in pairs if "=" in p)


def test_every_server_key_reaches_the_process(real: Gateway) -> None:
    argv = _cmdline(managed_pid(real, "tuned"))
    expected_pairs = {
        "--ctx-checkpoints": "4",
        "--checkpoint-min-step": "256",
        "--cache-ram": "64",
        "--cache-reuse": "256",
        "--ctx-size": "1024",
        "--parallel": "2",
        "--threads": "2",
        "--chat-template-file": ALL_KEYS["chat_template_file"],
    }
    for flag, value in expected_pairs.items():
        assert argv[argv.index(flag) + 1] == value, flag
    assert "--no-reasoning-preserve" in argv and "--reasoning-preserve" not in argv
    assert "--metrics" in argv  # extra_args
    assert _environ(managed_pid(real, "tuned"))["GGML_OP_OFFLOAD_MIN_BATCH"] == "64"
    props = direct_get(server_url(real, "tuned") + "/props", timeout=10).json()
    assert props["total_slots"] == 2
    assert props["default_generation_settings"]["n_ctx"] == 512  # 1024 shared by 2 slots
    assert props["endpoint_metrics"] is True
    assert direct_get(server_url(real, "tuned") + "/metrics", timeout=10).status_code == 200


def test_unset_keys_add_nothing(real: Gateway) -> None:
    argv = _cmdline(managed_pid(real, "smol"))
    for flag in (
        "--ctx-checkpoints",
        "--checkpoint-min-step",
        "--cache-reuse",
        "--threads",
        "--chat-template-file",
        "--reasoning-preserve",
        "--no-reasoning-preserve",
        "--metrics",
    ):
        assert flag not in argv
    # the host-memory prompt cache is the gateway's budget (prompt_cache.ram_mib, 4096 MiB
    # by default) shared by its three servers, not llama-server's 8 GiB each
    assert argv[argv.index("--cache-ram") + 1] == str(4096 // 3)
    assert "GGML_OP_OFFLOAD_MIN_BATCH" not in _environ(managed_pid(real, "smol"))
