"""The events benchmark's plan: what happens to a task's server between its turns, the calls
of each run in order, and the answers' lengths. Pure (no I/O): ``events_run.py`` runs it.

Each event runs the same agent workload (``tool-loop``, cut to a few turns) in each mode:

- ``slot-files``: through the gateway, ``prompt_cache.slot_files: true`` (each
  conversation's slot saved to a file and restored before its next call);
- ``no-slot-files``: the same gateway with ``slot_files: false``;
- ``litellm``: the LiteLLM proxy in front of llama-servers the benchmark runs itself.

The gateway modes run managed servers (profile ``model_path``, ``server: {parallel: 1,
ctx_size: ...}``). The events:

- ``restart``: the task's llama-server killed (SIGKILL) and started again between two
  turns (the gateway restarts its own; the benchmark restarts LiteLLM's on its port);
- ``gateway-restart``: the front stopped (SIGTERM) and started again with the same data
  folder: the gateway, which stops and starts its servers with it; LiteLLM's proxy,
  whose server the benchmark runs and keeps running;
- ``crowded``: more tasks than slots (``CROWDED_TASKS`` tasks on one slot, their turns
  round robin), the servers' host-memory prompt cache off (``--cache-ram 0``);
- ``crowded-ram``: the same with the host-memory cache on;
- ``failover``: two servers (the gateway's ``replicas: 2``; LiteLLM's two deployments of
  one model, ``order`` 1 and 2), the server of the task killed for good between two
  turns (the gateway may start its own again: the turn right after the kill is the one
  measured);
- ``side-requests``: between the agent's turns, a title call and a summary call with
  system prompts of their own, as Claude Code sends them, on the same task and the only
  slot.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bench.inference.caller import Caller
from bench.inference.workload import CHARS_PER_TOKEN, Workload, estimate_tokens

EVENTS_WORKLOAD = "tool-loop"
MODES = ("slot-files", "no-slot-files", "litellm")
SLOT_FILES, NO_SLOT_FILES, LITELLM = MODES
GATEWAY_MODES = (SLOT_FILES, NO_SLOT_FILES)

# Agent-realistic answers: a reasoning model writes several hundred tokens of reasoning
# a turn. llama-server's ``--reasoning-budget`` ends the reasoning there; ``max_tokens``
# leaves room for the answer after it. The four-mode benchmark (docs/benchmarks/
# inference.md) keeps the workloads' 64 tokens and a budget of 32, so that 22 turns fit.
REASONING_BUDGET = 250
MAX_TOKENS = 300
# each server's context: one slot of SmolLM2's 8,192 tokens
CTX_SIZE = 8192
# one thread a server: on two cores shared with other work, llama.cpp's threads wait on
# each other (measured on the benchmark's machine while other tests ran: 1.1 tokens a
# second generated with --threads 2, 52 with --threads 1)
THREADS = 1
# the host-memory prompt cache where an event has it on (MiB per server): the gateway's
# default ``prompt_cache.ram_mib`` for a profile of one server
HOST_CACHE_MIB = 4096
CROWDED_TASKS = 3
# the side requests' answers: a title or a one-line summary
SIDE_MAX_TOKENS = 48

Action = Literal["kill-server", "restart-front", "kill-for-good"]
CallKind = Literal["agent", "title", "summary"]


@dataclass(frozen=True, slots=True)
class Event:
    name: str
    what: str  # one sentence for the report
    turns: int  # agent turns per task
    tasks: int = 1
    # the action between the agent's turns ``turns - 1`` and ``turns`` (None: none)
    action: Action | None = None
    servers: int = 1
    cache_ram_mib: int = HOST_CACHE_MIB
    side_requests: bool = False

    def with_turns(self, turns: int) -> Event:
        """The event with ``turns`` agent turns a task (0: as defined)."""
        if turns <= 0:
            return self
        if turns < 2:
            raise ValueError("an event needs 2 agent turns or more: one before it, one after")
        return dataclasses.replace(self, turns=turns)


EVENTS: dict[str, Event] = {
    e.name: e
    for e in (
        Event(
            "restart",
            "the task's llama-server killed (SIGKILL) and started again before the last turn",
            turns=4,
            action="kill-server",
        ),
        Event(
            "gateway-restart",
            "the front (the gateway, or LiteLLM's proxy) stopped with SIGTERM and started "
            "again before the last turn",
            turns=4,
            action="restart-front",
        ),
        Event(
            "crowded",
            f"{CROWDED_TASKS} tasks on one slot, their turns round robin, the host-memory "
            "prompt cache off (`--cache-ram 0`)",
            turns=2,
            tasks=CROWDED_TASKS,
            cache_ram_mib=0,
        ),
        Event(
            "crowded-ram",
            f"{CROWDED_TASKS} tasks on one slot, their turns round robin, the host-memory "
            f"prompt cache on (`--cache-ram {HOST_CACHE_MIB}`)",
            turns=2,
            tasks=CROWDED_TASKS,
        ),
        Event(
            "failover",
            "two servers of one model; the task's server killed for good before the last turn",
            turns=4,
            action="kill-for-good",
            servers=2,
        ),
        Event(
            "side-requests",
            "a title call and a summary call (system prompts of their own, as Claude Code "
            "sends them) between the agent's turns, on the only slot, the host-memory prompt "
            "cache off",
            turns=3,
            cache_ram_mib=0,
            side_requests=True,
        ),
    )
}


def parse_events(text: str) -> list[Event]:
    """``--events``: comma-separated names, or ``all``."""
    names = [n for n in text.split(",") if n]
    if names == ["all"]:
        return list(EVENTS.values())
    unknown = [n for n in names if n not in EVENTS]
    if unknown or not names:
        raise ValueError(f"unknown event(s) {unknown}: of {', '.join(EVENTS)} or all")
    return [EVENTS[n] for n in names]


def parse_modes(text: str) -> list[str]:
    modes = [m for m in text.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"unknown mode(s) {unknown}: of {', '.join(MODES)}")
    return modes


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """One call of a run: task ``task`` (1-based), an agent turn or a side request.

    ``event_before``: the event's action comes just before it. ``after_event``: it is a
    call measured as "after the event": the agent turn right after the action; in a
    crowded run each turn after the first round (the other tasks took the slot since);
    with side requests each agent turn after the first (they took the slot since).
    """

    seq: int  # 1-based, over the run
    task: int
    kind: CallKind
    turn: int  # the task's agent turn (a side request: the turn it follows)
    event_before: bool = False
    after_event: bool = False


def plan(event: Event) -> list[PlannedCall]:
    """Every call of one run of ``event``, in the order sent."""
    calls: list[PlannedCall] = []
    for turn in range(1, event.turns + 1):
        for task in range(1, event.tasks + 1):
            acted = event.action is not None and task == 1 and turn == event.turns
            after = acted or (event.action is None and turn > 1)
            calls.append(PlannedCall(len(calls) + 1, task, "agent", turn, acted, after))
            if event.side_requests and turn < event.turns:
                for kind in ("title", "summary"):
                    calls.append(PlannedCall(len(calls) + 1, task, kind, turn))
    return calls


# Claude-Code-shaped side requests: a short system prompt of their own, the agent's last
# input (title) or its conversation as text (summary) as the user message.
TITLE_SYSTEM = (
    "Analyze if this message indicates a new conversation topic. If it does, extract a 2-3 "
    "word title that captures the new topic. Format your response as a JSON object with "
    "two fields: 'isNewTopic' (boolean) and 'title' (string, or null if isNewTopic is "
    "false). Only include these fields, no other text."
)
SUMMARY_SYSTEM = (
    "Summarize this coding conversation in under 50 characters.\n"
    "Capture the main task, key files, problems addressed, and current status."
)
# what of the conversation a side request quotes
TITLE_INPUT_CHARS = 1000
SUMMARY_MESSAGE_CHARS = 300
SUMMARY_CHARS = 2400


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str) and content:
        return content
    calls = message.get("tool_calls") or []
    return " ".join(f"{c['function']['name']}({c['function'].get('arguments', '')})" for c in calls)


def side_messages(kind: CallKind, history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages of a title or summary call about the agent's conversation ``history``
    (its messages as last sent, the answer after them)."""
    said = [m for m in history if m.get("role") != "system"]
    if kind == "title":
        inputs = [m for m in said if m.get("role") in ("user", "tool")]
        text = _text(inputs[-1])[:TITLE_INPUT_CHARS] if inputs else ""
        return [{"role": "system", "content": TITLE_SYSTEM}, {"role": "user", "content": text}]
    if kind == "summary":
        lines = [
            f"{m.get('role', '?').capitalize()}: {_text(m)[:SUMMARY_MESSAGE_CHARS]}" for m in said
        ]
        text = "\n".join(lines)[-SUMMARY_CHARS:]
        return [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": text}]
    raise ValueError(f"not a side request: {kind}")


def peak_prompt_estimate(workload: Workload, turns: int, answer_tokens: int) -> int:
    """The estimated largest prompt of ``turns`` agent turns whose answers are each
    ``answer_tokens`` long and go back whole (the gateway puts the reasoning back):
    characters / 3.5 and 4 tokens a message, as the workloads are sized."""
    cut = dataclasses.replace(workload, steps=workload.steps[:turns])
    caller = Caller(cut, keep_reasoning=True)
    answer = {"content": "x" * int(answer_tokens * CHARS_PER_TOKEN)}
    peak = 0
    while not caller.done:
        request = caller.next_request()
        tokens = estimate_tokens(json.dumps(request.tools)) if request.tools else 0
        tokens += sum(estimate_tokens(m.get("content") or "") + 4 for m in request.messages)
        peak = max(peak, tokens)
        caller.record_answer(answer)
    return peak


def check_fits(workload: Workload, turns: int, max_tokens: int, ctx_size: int) -> int:
    """The estimated largest prompt and its answer; ``ValueError`` past the slot's context."""
    need = peak_prompt_estimate(workload, turns, max_tokens) + max_tokens
    if need > ctx_size:
        raise ValueError(
            f"{turns} turns of {workload.name} with answers of {max_tokens} tokens need about "
            f"{need} tokens, over a slot's {ctx_size}: fewer turns or shorter answers"
        )
    return need
