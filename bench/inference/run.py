"""One workload in one mode on a fresh llama-server: every call sent, timed and counted.

What each call evaluated comes from where the mode can tell it: the gateway's call log
for the gateway modes (its ``evaluated_tokens``, ``miss_cause`` and the cache repair's
own records), and the server's ``/metrics`` counter ``llamacpp:prompt_tokens_total``
(prompt tokens evaluated, cached ones excluded) read before and after each call for the
others. Calls are sent one at a time, so the difference is that call's alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import real_server
from bench.inference.caller import Caller
from bench.inference.modes import Mode
from bench.inference.workload import Workload
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE

CALL_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class Settings:
    model: str
    template: Path
    reasoning_budget: int
    max_tokens: int | None  # None: the workload's
    temperature: float
    seed: int


@dataclass(slots=True)
class Front:
    """Where the mode's requests go and how they are told apart."""

    url: str
    headers: dict[str, str]
    model: str
    data_dir: Path | None = None  # the gateway's: its call log
    calls_seen: int = field(default=0)


def _metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise RuntimeError(f"llama-server's /metrics has no {name}")


@contextmanager
def _front(mode: Mode, server: str, run_dir: Path, task: str, attempt: int) -> Iterator[Front]:
    name = f"{mode.name}-{attempt}"
    if mode.front == "direct":
        yield Front(server, {}, "local")
    elif mode.front == "litellm":
        with real_server.litellm_proxy(server, run_dir, name=f"litellm-{attempt}") as url:
            auth = {"authorization": f"Bearer {real_server.LITELLM_KEY}"}
            yield Front(url, auth, real_server.LITELLM_MODEL)
    else:
        data_dir = run_dir / "gateway"
        data_dir.mkdir(exist_ok=True)
        profile = {"reasoning_history": mode.reasoning_history}
        config = real_server.write_gateway_config(data_dir, server, profile)
        with real_server.gateway(config, run_dir, name=f"gateway-{name}") as url:
            yield Front(url, {"X-BoundedCode-Task": task}, "local", data_dir)


def _body(messages: list[dict[str, Any]], tools: list[Any], s: Settings, w: Workload) -> Any:
    body: dict[str, Any] = {
        "model": "",
        "messages": messages,
        "max_tokens": s.max_tokens or w.max_tokens,
        "temperature": s.temperature,
        "seed": s.seed,
    }
    if tools:
        body["tools"] = tools
    return body


def run_mode(workload: Workload, mode: Mode, settings: Settings, run_dir: Path) -> list[Any]:
    """Every call of ``workload`` in ``mode``: one sample each, in order."""
    run_dir.mkdir(parents=True)
    task = workload.task
    caller = Caller(workload, keep_reasoning=mode.keep_reasoning)
    samples: list[dict[str, Any]] = []
    budget = ["--reasoning-budget", str(settings.reasoning_budget)]
    with ExitStack() as stack:
        server = stack.enter_context(
            real_server.llama_server(run_dir, settings.model, settings.template, budget)
        )
        metrics = stack.enter_context(httpx.Client(base_url=server, timeout=30))
        fronts = ExitStack()
        stack.enter_context(fronts)
        front = fronts.enter_context(_front(mode, server, run_dir, task, 1))
        restarts = 1
        client = stack.enter_context(httpx.Client(timeout=CALL_TIMEOUT_S))
        while not caller.done:
            request = caller.next_request()
            if request.restart_before:
                fronts.close()
                restarts += 1
                front = fronts.enter_context(_front(mode, server, run_dir, task, restarts))
            body = _body(request.messages, request.tools, settings, workload)
            body["model"] = front.model
            headers = {**front.headers, "X-BoundedCode-Purpose": request.purpose}
            before = _metric(metrics, "llamacpp:prompt_tokens_total")
            started = time.perf_counter()
            resp = client.post(front.url + "/v1/chat/completions", json=body, headers=headers)
            wait_ms = (time.perf_counter() - started) * 1000
            if resp.status_code != 200:
                raise RuntimeError(f"{mode.name} step {request.step.index}: {resp.text[:500]}")
            answer = resp.json()
            after = _metric(metrics, "llamacpp:prompt_tokens_total")
            message = answer["choices"][0]["message"]
            caller.record_answer(message)
            usage = answer.get("usage") or {}
            samples.append(
                {
                    "workload": workload.name,
                    "mode": mode.name,
                    "step": request.step.index,
                    "purpose": request.purpose,
                    "turn": request.step.turn,
                    "restarted": request.restart_before,
                    "messages": len(request.messages),
                    "prompt_tokens": usage.get("prompt_tokens"),
                    "completion_tokens": usage.get("completion_tokens"),
                    "server_evaluated": int(after - before),
                    "wait_ms": round(wait_ms, 1),
                    "tool_calls": len(message.get("tool_calls") or []),
                    "reasoning_chars": len(message.get("reasoning_content") or ""),
                    "finish_reason": answer["choices"][0].get("finish_reason"),
                }
            )
            if front.data_dir is not None:
                real_server.wait_for_repairs(front.data_dir, task, len(samples))
        fronts.close()
    if mode.metered_by_gateway:
        _join_call_log(samples, real_server.calls(run_dir / "gateway"), task)
    else:
        for sample in samples:
            sample["evaluated_tokens"] = sample["server_evaluated"]
            sample["repair_evaluated"] = 0
    return samples


def _join_call_log(samples: list[dict[str, Any]], calls: list[dict[str, Any]], task: str) -> None:
    """The gateway's record of each call, in order; each repair beside the call it followed."""
    mine = sorted((c for c in calls if c["task"] == task), key=lambda c: c["started_at"])
    turns = [c for c in mine if c["purpose"] != REPAIR_PURPOSE]
    repairs = [c for c in mine if c["purpose"] == REPAIR_PURPOSE]
    if len(turns) != len(samples):
        raise RuntimeError(f"{len(samples)} calls sent, {len(turns)} in the call log")
    for sample, call, repair in zip(samples, turns, repairs, strict=False):
        sample["evaluated_tokens"] = call["evaluated_tokens"]
        sample["cached_tokens"] = call["cached_tokens"]
        sample["reusable_tokens"] = call["reusable_tokens"]
        sample["miss_cause"] = call["miss_cause"]
        sample["miss_at"] = call.get("miss_at")
        sample["ttft_ms"] = call["ttft_ms"]
        # the repair after this answer readies the next call
        sample["repair_evaluated"] = repair["evaluated_tokens"] or 0
        sample["repair_miss_cause"] = repair["miss_cause"]
