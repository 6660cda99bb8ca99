"""The agent-shaped caller of a workload: the messages of each request, from the model's answers.

Pure (no I/O): the runner asks ``next_request()`` for each step, sends it, and gives the
model's message back with ``record_answer()``. What goes into the history:

- each purpose is its own conversation (its own system prompt and tools), as the
  gateway meters them: one task, one history per purpose;
- the model's answer goes back as the model wrote it — its content and any tool calls
  (id, name, arguments) — and, in bounded mode (the default), without its
  ``reasoning_content``; nothing else is ever put in an assistant message;
- the step's input then follows: as one ``tool`` message per tool call of that answer,
  for the model's own tool-call ids (the input's text answers the first call, the
  others get ``NO_MORE_OUTPUT``), or as a ``user`` message when the answer made no call
  (and for a conversation's first step);
- a condensation (``condense``: turns ``first``..``last``) removes those turns' answers
  and the inputs that replied to them (so turn 1 stays whole, and the turn after
  ``last`` starts at the model's answer), and puts the summary in their place as a
  ``user`` message: a tool call is never left without its result, nor a result
  without its call;
- ``restart_before`` is only passed on: restarting the gateway is the runner's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.inference.workload import Step, Workload

# the result of any tool call of an answer after its first: the workload has one input
NO_MORE_OUTPUT = "(no further output)"
SUMMARY_PREFIX = "Summary of the earlier work (condensed):\n"


class CallerError(RuntimeError):
    """``next_request`` and ``record_answer`` called out of turn."""


@dataclass(frozen=True, slots=True)
class Request:
    """What the runner sends for one step."""

    step: Step
    task: str
    purpose: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    restart_before: bool


@dataclass(slots=True)
class _Segment:
    """Messages the history got at once: an input (``kind`` "input"), an answer, the system
    prompt or a summary; ``turn`` is the purpose's turn they belong to."""

    kind: str
    turn: int
    messages: list[dict[str, Any]]


@dataclass(slots=True)
class _Thread:
    segments: list[_Segment] = field(default_factory=list)
    last_answer: dict[str, Any] | None = None

    def messages(self) -> list[dict[str, Any]]:
        return [dict(m) for s in self.segments for m in s.messages]


def answer_message(answer: Mapping[str, Any], keep_reasoning: bool = False) -> dict[str, Any]:
    """The assistant message that goes back into the history: the model's content and tool
    calls as written (and its reasoning only if ``keep_reasoning``); nothing added.

    An answer with neither content nor tool calls goes back with empty content.
    """
    message: dict[str, Any] = {"role": "assistant"}
    calls = [
        {
            "id": c["id"],
            "type": c.get("type", "function"),
            "function": {
                "name": c["function"]["name"],
                "arguments": c["function"].get("arguments", ""),
            },
        }
        for c in answer.get("tool_calls") or []
    ]
    content = answer.get("content")
    message["content"] = content if content is not None or calls else ""
    if calls:
        message["tool_calls"] = calls
    if keep_reasoning and answer.get("reasoning_content"):
        message["reasoning_content"] = answer["reasoning_content"]
    return message


def input_messages(step: Step, previous: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The step's input: tool results for the previous answer's tool-call ids, else a user
    message."""
    calls = (previous or {}).get("tool_calls") or []
    if not calls:
        return [{"role": "user", "content": step.text}]
    return [
        {
            "role": "tool",
            "tool_call_id": c["id"],
            "content": step.text if i == 0 else NO_MORE_OUTPUT,
        }
        for i, c in enumerate(calls)
    ]


def condense(segments: list[_Segment], first: int, last: int, summary: str) -> list[_Segment]:
    """The segments with turns ``first``..``last`` (their answers, and the inputs that replied
    to them: turns ``first + 1``..``last + 1``) replaced by one user message."""
    kept: list[_Segment] = []
    placed = False
    for seg in segments:
        removed = (seg.kind == "answer" and first <= seg.turn <= last) or (
            seg.kind == "input" and first < seg.turn <= last + 1
        )
        if not removed:
            kept.append(seg)
            continue
        if not placed:
            text = SUMMARY_PREFIX + summary
            kept.append(_Segment("summary", seg.turn, [{"role": "user", "content": text}]))
            placed = True
    return kept


class Caller:
    """Walks a workload step by step; one instance per run."""

    def __init__(self, workload: Workload, keep_reasoning: bool = False) -> None:
        self.workload = workload
        self.keep_reasoning = keep_reasoning
        self._threads: dict[str, _Thread] = {}
        self._next = 0
        self._waiting: Step | None = None

    @property
    def done(self) -> bool:
        return self._next >= len(self.workload.steps) and self._waiting is None

    def next_request(self) -> Request:
        """The request of the next step; then ``record_answer`` must follow."""
        if self._waiting is not None:
            raise CallerError(f"step {self._waiting.index} is waiting for its answer")
        if self._next >= len(self.workload.steps):
            raise CallerError("the workload is done")
        step = self.workload.steps[self._next]
        purpose = self.workload.purposes[step.purpose]
        thread = self._threads.setdefault(step.purpose, _Thread())
        if not thread.segments:
            thread.segments.append(
                _Segment("system", 0, [{"role": "system", "content": purpose.system}])
            )
        if step.condense is not None:
            c = step.condense
            thread.segments = condense(thread.segments, c.first, c.last, c.summary)
        thread.segments.append(
            _Segment("input", step.turn, input_messages(step, thread.last_answer))
        )
        self._waiting = step
        return Request(
            step=step,
            task=self.workload.task,
            purpose=step.purpose,
            messages=thread.messages(),
            tools=[dict(t) for t in purpose.tools],
            restart_before=step.restart_before,
        )

    def record_answer(self, answer: Mapping[str, Any]) -> dict[str, Any]:
        """Take the model's message (``choices[0].message``) for the waiting step; return the
        assistant message that went into the history."""
        step = self._waiting
        if step is None:
            raise CallerError("no request is waiting for an answer")
        thread = self._threads[step.purpose]
        message = answer_message(answer, self.keep_reasoning)
        thread.segments.append(_Segment("answer", step.turn, [message]))
        thread.last_answer = message
        self._waiting = None
        self._next += 1
        return message
