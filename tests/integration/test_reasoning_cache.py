"""The cache effect of reasoning in the history, measured on the real llama-server.

SmolLM2 with a Qwen3-style template (earlier turns rendered as <think>reasoning</think>
+ answer, the generation prompt opening <think>) and a per-request reasoning budget,
so the model writes real reasoning_content and then an answer. A bounded-mode caller
drops reasoning_content from the history it sends back; the gateway restores it
(`auto`) or not (`drop`), and the server's `timings.prompt_n` tells what it evaluated.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from boundedcode_gateway.llama_server.flags import SLOTS_DEBUG_ENV
from boundedcode_gateway.policy.cache_misses import MISS_TOLERANCE_TOKENS
from tests.e2e.conftest import Gateway
from tests.integration.conftest import TEMPLATES, run_llama_server, start_real_gateway

TURNS = 8
BUDGET = {"reasoning_budget_tokens": 120, "max_tokens": 200, "temperature": 0.8}
QUESTIONS = [
    "Explain step by step how a hash map stores a key.",
    "What happens on a collision?",
    "How does resizing work?",
    "What is the load factor?",
    "Compare open addressing and chaining.",
    "What is a good hash function?",
    "How do iterators behave during a resize?",
    "Summarise everything briefly.",
]


def run_server(*extra: str) -> Iterator[str]:
    """A llama-server of our own, so a restarted gateway finds its cache still warm; as a
    managed server runs: /slots shows the generated text, so misses can be named."""
    yield from run_llama_server(
        TEMPLATES / "qwen3_style.jinja", *extra, ctx_size=8192, env=SLOTS_DEBUG_ENV
    )


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    yield from run_server()


@pytest.fixture(scope="module")
def server_without_preserve() -> Iterator[str]:
    yield from run_server("--no-reasoning-preserve")


NO_REPAIR = {"cache_repair": False}


def profiles(url: str) -> dict[str, Any]:
    return {
        "auto": {"provider": "local", "external_url": url},
        # without the repair, so that what dropping reasoning costs shows
        "drop": {
            "provider": "local",
            "external_url": url,
            "reasoning_history": "drop",
            "server": NO_REPAIR,
        },
    }


def converse(
    gw: Gateway,
    model: str,
    task: str,
    turns: range,
    history: list[Any],
    keep_reasoning: bool,
    wrote: list[bool],
    seed: int = 7,
) -> list[Any]:
    """Run ``turns`` as a caller does; return the history it would send next, and note in
    ``wrote`` whether each answer came with reasoning. Between turns the caller waits for
    the gateway's follow-up of the answer, as an agent's tool time would let it finish."""
    client = gw.client(task=task)
    for i in turns:
        history = [*history, {"role": "user", "content": f"[{task}] {QUESTIONS[i]}"}]
        reply = client.chat.completions.create(
            model=model, messages=history, extra_body={**BUDGET, "seed": seed}
        )
        message = reply.choices[0].message
        sent: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
        reasoning = (message.model_extra or {}).get("reasoning_content")
        wrote.append(bool(reasoning))
        if keep_reasoning and reasoning is not None:
            sent["reasoning_content"] = reasoning
        history.append(sent)
        gw.settle()
    return history


def task_calls(gw: Gateway, task: str, purpose: str = "agent_turn") -> list[dict[str, Any]]:
    return [c for c in gw.calls(repairs=True) if c["task"] == task and c["purpose"] == purpose]


def evaluated(gw: Gateway, task: str) -> list[int]:
    return [c["evaluated_tokens"] for c in task_calls(gw, task)]


def assert_every_turn_cached(gw: Gateway, task: str, first: int = 1) -> None:
    """Each turn from ``first`` on evaluated only its new tokens: its miss is ``none``, and
    what it evaluated is the prompt less what the previous turn left reusable."""
    calls = task_calls(gw, task)
    for t, call in enumerate(calls[first:], start=first):
        new = call["prompt_tokens"] - call["reusable_tokens"]
        assert call["miss_cause"] == "none", (task, t, call)
        assert call["evaluated_tokens"] <= new + MISS_TOLERANCE_TOKENS, (task, t, call)
        assert call["evaluated_tokens"] < 60, (task, t, call)


def test_reasoning_history_on_the_real_server(server: str, tmp_path: Path) -> None:
    gw = start_real_gateway_external(tmp_path / "a", server)
    caps = httpx.get(gw.url + "/v1/models/auto", timeout=10).json()["capabilities"]
    assert caps["reasoning_back"] is True and caps["source"] == "props"
    wrote: dict[str, list[bool]] = {k: [] for k in ("auto", "drop", "direct", "resumed")}
    converse(gw, "auto", "bounded-auto", range(TURNS), [], False, wrote["auto"])
    converse(gw, "drop", "bounded-drop", range(TURNS), [], False, wrote["drop"])
    converse(gw, "auto", "direct", range(TURNS), [], True, wrote["direct"])
    history = converse(gw, "auto", "resumed", range(4), [], False, wrote["resumed"])
    gw.stop()
    # the gateway restarts between turns 4 and 5, on the same data folder
    gw2 = start_real_gateway_external(tmp_path / "a", server)
    converse(gw2, "auto", "resumed", range(4, TURNS), history, False, wrote["resumed"])
    auto, drop = evaluated(gw2, "bounded-auto"), evaluated(gw2, "bounded-drop")
    direct, resumed = evaluated(gw2, "direct"), evaluated(gw2, "resumed")
    repairs = task_calls(gw2, "bounded-auto", "cache_repair")
    drop_calls = task_calls(gw2, "bounded-drop")
    gw2.stop()

    print("\nturn  auto  drop  ratio  direct  resumed  (* drop's previous answer had reasoning)")
    for t in range(TURNS):
        mark = "*" if t and wrote["drop"][t - 1] else " "
        print(
            f"{t + 1:>4}  {auto[t]:>4}  {drop[t]:>4}{mark} {drop[t] / auto[t]:>5.1f}  "
            f"{direct[t]:>6}  {resumed[t]:>7}"
        )
    # the model kept reasoning wherever its history showed reasoning
    assert all(wrote["auto"]) and all(wrote["direct"]) and all(wrote["resumed"])
    # auto, direct mode (keeps its own copy) and a resumed run: every turn evaluates only
    # the new question and the template's tail (the repair fixed any token split)
    assert_every_turn_cached(gw2, "bounded-auto")
    assert_every_turn_cached(gw2, "direct")
    # the first turn after the restart knows no previous call, yet finds its cache
    assert_every_turn_cached(gw2, "resumed", first=5)
    assert resumed[4] < 60, resumed
    # every answer got its repair, metered with what it evaluated
    assert len(repairs) == TURNS and all(r["status"] == "ok" for r in repairs), repairs
    assert all(r["evaluated_tokens"] is not None for r in repairs)
    # drop, no repair: a turn after an answer with reasoning evaluates that answer again,
    # and its miss is named
    dropped = [drop_calls[t] for t in range(1, TURNS) if wrote["drop"][t - 1]]
    assert dropped, drop
    for call in dropped:
        assert call["miss_cause"] == "reasoning_dropped", call
        assert call["evaluated_tokens"] > max(auto[1:]) + 25, (auto, drop)


@pytest.mark.parametrize("seed", [11, 23, 42])
def test_every_turn_is_cached_whatever_the_model_samples(
    server: str, tmp_path: Path, seed: int
) -> None:
    """Other seeds, other samples: with the repair, no turn reads an earlier answer again."""
    gw = start_real_gateway_external(tmp_path, server)
    task = f"seed-{seed}"
    converse(gw, "auto", task, range(TURNS), [], False, [], seed=seed)
    assert_every_turn_cached(gw, task)
    gw.stop()


def start_real_gateway_external(data_dir: Path, url: str) -> Gateway:
    return start_real_gateway(data_dir, profiles(url), managed=False)


def test_without_reasoning_preserve_only_the_current_turn_keeps_it(
    server: str, server_without_preserve: str, tmp_path: Path
) -> None:
    """`server.reasoning_preserve: false`: the prompt grows less, but every new question
    changes how the previous turn renders, so the server reads that turn again (named
    ``template_render``); the repair reads it while the caller is away instead."""
    turns = range(5)
    results: dict[str, list[dict[str, Any]]] = {}
    runs = (
        ("preserve", server, "unrepaired"),
        ("no-preserve", server_without_preserve, "unrepaired"),
        ("no-preserve-repaired", server_without_preserve, "auto"),
    )
    for name, url, model in runs:
        gw = start_real_gateway(
            tmp_path / name,
            {**profiles(url), "unrepaired": {**profiles(url)["auto"], "server": NO_REPAIR}},
            managed=False,
        )
        converse(gw, model, name, turns, [], False, [])
        results[name] = task_calls(gw, name)
        gw.stop()
    kept, lean, repaired = (results[n] for n, _, _ in runs)
    for name, calls in results.items():
        print(
            f"\n{name}: prompt {[c['prompt_tokens'] for c in calls]} "
            f"evaluated {[c['evaluated_tokens'] for c in calls]} "
            f"miss {[c['miss_cause'] for c in calls]}"
        )
    assert lean[-1]["prompt_tokens"] < kept[-1]["prompt_tokens"]  # earlier reasoning not sent
    # the previous turn is read again, and the log says why
    assert sum(c["evaluated_tokens"] for c in lean[1:]) > 2 * sum(
        c["evaluated_tokens"] for c in kept[1:]
    )
    assert [c["miss_cause"] for c in lean[1:]] == ["template_render"] * 4, lean
    # with the repair, the caller no longer waits for it
    assert [c["miss_cause"] for c in repaired[1:]] == ["none"] * 4, repaired
