"""The cache effect of reasoning in the history, measured on the real llama-server.

SmolLM2 with a Qwen3-style template (earlier turns rendered as <think>reasoning</think>
+ answer, the generation prompt opening <think>) and a per-request reasoning budget,
so the model writes real reasoning_content and then an answer. A bounded-mode caller
drops reasoning_content from the history it sends back; the gateway restores it
(`auto`) or not (`drop`), and the server's `timings.prompt_n` tells what it evaluated.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from boundedcode_gateway.llama_server.launcher import free_port
from boundedcode_gateway.llama_server.locate import find_llama_server, resolve_model_path
from tests.e2e.conftest import Gateway
from tests.integration.conftest import MODEL, TEMPLATES, start_real_gateway

TURNS = 8
BUDGET = {"reasoning_budget_tokens": 120, "max_tokens": 200, "temperature": 0.8, "seed": 7}
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
    """A llama-server of our own, so a restarted gateway finds its cache still warm."""
    port = free_port()
    argv = [
        find_llama_server(None),
        "--model",
        str(resolve_model_path(MODEL, "model")),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--ctx-size",
        "8192",
        "--parallel",
        "1",
        "--chat-template-file",
        str(TEMPLATES / "qwen3_style.jinja"),
        "--no-webui",
        *extra,
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "llama-server did not start"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    yield from run_server()


@pytest.fixture(scope="module")
def server_without_preserve() -> Iterator[str]:
    yield from run_server("--no-reasoning-preserve")


def profiles(url: str) -> dict[str, Any]:
    return {
        "auto": {"provider": "local", "external_url": url},
        "drop": {"provider": "local", "external_url": url, "reasoning_history": "drop"},
    }


def converse(
    gw: Gateway,
    model: str,
    task: str,
    turns: range,
    history: list[Any],
    keep_reasoning: bool,
    wrote: list[bool],
) -> list[Any]:
    """Run ``turns`` as a caller does; return the history it would send next, and note in
    ``wrote`` whether each answer came with reasoning."""
    client = gw.client(task=task)
    for i in turns:
        history = [*history, {"role": "user", "content": f"[{task}] {QUESTIONS[i]}"}]
        reply = client.chat.completions.create(model=model, messages=history, extra_body=BUDGET)
        message = reply.choices[0].message
        sent: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
        reasoning = (message.model_extra or {}).get("reasoning_content")
        wrote.append(bool(reasoning))
        if keep_reasoning and reasoning is not None:
            sent["reasoning_content"] = reasoning
        history.append(sent)
    return history


def evaluated(gw: Gateway, task: str) -> list[int]:
    return [c["evaluated_tokens"] for c in gw.calls() if c["task"] == task]


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
    later = slice(1, TURNS)
    # auto: each turn evaluates only the new question and the template's tail
    assert max(auto[later]) < 60, auto
    # drop: a turn after an answer with reasoning evaluates that answer again
    dropped = [drop[t] for t in range(1, TURNS) if wrote["drop"][t - 1]]
    assert dropped and min(dropped) > max(auto[later]) + 25, (auto, drop)
    assert sum(drop[later]) > 2 * sum(auto[later]), (auto, drop)
    # direct mode (keeps its own copy) and a resumed run behave like auto
    assert sorted(direct[later])[3] <= sorted(auto[later])[3] + 10, (auto, direct)
    assert sorted(resumed[later])[3] <= sorted(auto[later])[3] + 10, (auto, resumed)
    assert resumed[4] < 60, resumed  # the first turn after the restart


def start_real_gateway_external(data_dir: Path, url: str) -> Gateway:
    return start_real_gateway(data_dir, profiles(url), managed=False)


def test_without_reasoning_preserve_only_the_current_turn_keeps_it(
    server: str, server_without_preserve: str, tmp_path: Path
) -> None:
    """`server.reasoning_preserve: false`: the prompt grows less, but every new question
    changes how the previous turn renders, so the server reads that turn again."""
    turns = range(5)
    results: dict[str, tuple[list[int], list[int]]] = {}
    for name, url in (("preserve", server), ("no-preserve", server_without_preserve)):
        gw = start_real_gateway_external(tmp_path / name, url)
        converse(gw, "auto", name, turns, [], False, [])
        calls = [c for c in gw.calls() if c["task"] == name]
        results[name] = (
            [c["prompt_tokens"] for c in calls],
            [c["evaluated_tokens"] for c in calls],
        )
        gw.stop()
    kept_prompt, kept_eval = results["preserve"]
    lean_prompt, lean_eval = results["no-preserve"]
    print(f"\npreserve: prompt {kept_prompt} evaluated {kept_eval}")
    print(f"no-preserve: prompt {lean_prompt} evaluated {lean_eval}")
    assert lean_prompt[-1] < kept_prompt[-1]  # the earlier reasoning is no longer sent
    assert sum(lean_eval[1:]) > 2 * sum(kept_eval[1:])  # the previous turn is read again
