"""A scripted model behind the gateway that does small tasks as a competent model would.

API (for the agents' tests):

    model = ScriptedModel(break_at=BreakPoint.IN_TEXT)
    with model.serve() as url:          # the fake llama-server, on 127.0.0.1
        ...                             # a gateway profile `local` with external_url: url
    model.broke                         # a Break (where, in which answer) or None
    model.answers                       # every Answer given, in order (step, tool, broke)

The task, in the agent's prompt: `task_prompt(Task(path, text))`, i.e. "Create the file
PATH containing exactly the text "TEXT", then say done." For a request with tools the
model writes the file with the agent's own file tool (or patch tool, or shell) — chosen
from the tools' schemas, tool_choice.py — then reads it back with its read tool (or
shell), then answers `done`: two tool calls and a text, each answer with some reasoning
and text before its call, so every `BreakPoint` exists in the first answer. The step is
read from the conversation (assistant turns with tool calls after the task), so a resent
or continued request gets the same answer, and the fake continues it where it broke.

A request with no tools goes to `TEXT_RESPONDERS` (append a `TextResponder`: it gets the
chat body and returns the answer's text, or None to pass); then a request for JSON output
(`response_format` with a schema: Claude Code's title call) gets an instance of the
schema; anything else (quota and ping calls) gets a short text.

Running an agent against it through the gateway: tests/agents/harness.py (`run_agent`,
`AgentCommand`, `register`), and tests/agents/conftest.py (`agent_runs`, runs in a pool).

`break_at`: the stream breaks once, on the first streamed answer to the task (or to a text
responder) where that point exists, then never again; `broke` records it.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from tests.agents.stream_layout import BreakPoint, break_after, layout
from tests.agents.tool_choice import ToolUse, read_call, tools_of, write_call
from tests.fakes.common import JSON, Reply, content_text
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import serve_in_thread

__all__ = [
    "TEXT_RESPONDERS",
    "Answer",
    "Break",
    "BreakPoint",
    "ScriptedModel",
    "Task",
    "TextResponder",
    "find_task",
    "task_prompt",
]

# a chat body with no tools → the answer's text, or None when it is not this responder's
TextResponder = Callable[[JSON], str | None]
TEXT_RESPONDERS: list[TextResponder] = []

# agents' prompts are long (Claude Code's tools alone are tens of thousands of tokens here)
N_CTX = 1_000_000
_TASK_RE = re.compile(
    r"[Cc]reate the file\s+`?(?P<path>[^\s`\"]+)`?\s+containing exactly the text\s+"
    r"\"(?P<text>[^\"]*)\""
)


@dataclass(frozen=True)
class Task:
    """Write `text` into the file `path` (absolute), then say done."""

    path: str
    text: str


def task_prompt(task: Task) -> str:
    """The prompt that asks for `task`, as the model reads it."""
    return f'Create the file {task.path} containing exactly the text "{task.text}", then say done.'


@dataclass(frozen=True)
class Break:
    """Where the stream broke: the point, the step it broke in, after how many chunks."""

    point: BreakPoint
    step: str
    after_chunks: int
    request: int  # which chat request it was (0: the first)


@dataclass(frozen=True)
class Answer:
    """One answer the model gave: its step ("write", "read", "done", "text", "json", ...)."""

    step: str
    tool: ToolUse | None
    streamed: bool
    broke: bool


def find_task(messages: list[Any]) -> tuple[Task, int] | None:
    """The task and the index of the user message that asked for it."""
    for i, msg in enumerate(messages):
        if isinstance(msg, dict) and msg.get("role") == "user":
            found = _TASK_RE.search(content_text(msg.get("content")))
            if found:
                return Task(found["path"], found["text"]), i
    return None


def instance_of(schema: Any) -> Any:
    """A value that fits a JSON schema (the parts answers need: objects, enums, scalars)."""
    if not isinstance(schema, dict):
        return "Create a file"
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return instance_of(schema[key][0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties")
        return {k: instance_of(v) for k, v in props.items()} if isinstance(props, dict) else {}
    if kind == "array":
        return [instance_of(schema.get("items"))] if schema.get("minItems") else []
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    return "Create a file"


class ScriptedModel:
    """The fake llama-server with a responder that does the task (module docstring)."""

    def __init__(self, break_at: BreakPoint = BreakPoint.NONE, tokens_per_chunk: int = 1):
        # one progress chunk at each end of a prompt, whatever its length: the layout's rule
        self.fake = FakeLlamaServer(
            n_ctx=N_CTX, progress_batch=N_CTX, tokens_per_chunk=tokens_per_chunk
        )
        self.fake.responder = self.respond
        self.break_at = break_at
        self.broke: Break | None = None
        self.answers: list[Answer] = []
        self.requests = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def serve(self) -> Iterator[str]:
        """Serve the model on 127.0.0.1; yields its URL."""
        with serve_in_thread(self.fake.app) as server:
            yield server.url

    def respond(self, body: JSON) -> Reply:
        with self._lock:
            index, self.requests = self.requests, self.requests + 1
            step, tool, reply = self._answer(body)
            streamed = body.get("stream") is True
            broke = False
            if streamed and self.broke is None and step not in ("json", "side"):
                chunks = layout(
                    reply,
                    body,
                    server_thinks=self.fake.thinking,
                    tokens_per_chunk=self.fake.tokens_per_chunk,
                )
                cut = break_after(self.break_at, chunks)
                if cut is not None:
                    reply.break_after_chunks = cut
                    self.broke = Break(self.break_at, step, cut, index)
                    broke = True
            self.answers.append(Answer(step, tool, streamed, broke))
            return reply

    def _answer(self, body: JSON) -> tuple[str, ToolUse | None, Reply]:
        messages: list[Any] = list(body.get("messages") or [])
        if messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
            messages = messages[:-1]  # the gateway's continuation: the same answer goes on
        tools = tools_of(body)
        if not tools:
            return self._without_tools(body)
        found = find_task(messages)
        if found is None:
            return "side", None, Reply(content="There is nothing to do here.")
        task, asked_at = found
        calls = sum(
            1
            for m in messages[asked_at + 1 :]
            if isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls")
        )
        name = task.path.rsplit("/", 1)[-1]
        use = None
        if calls == 0:
            use = write_call(tools, task.path, task.text)
            step, said = "write", f"I will write the file {name} now."
        elif calls == 1:
            use = read_call(tools, task.path)
            step, said = "read", f"Now I will read {name} back to check it."
        if use is None:
            return "done", None, self._done(task, name)
        thought = f"The user wants the file {name}. The {use.name} tool can do this step."
        call = {"name": use.name, "arguments": use.arguments}
        return step, use, Reply(content=said, reasoning_content=thought, tool_calls=[call])

    @staticmethod
    def _done(task: Task, name: str) -> Reply:
        thought = f"The file {name} holds the text asked for, so the task is finished."
        return Reply(content="done", reasoning_content=thought)

    @staticmethod
    def _without_tools(body: JSON) -> tuple[str, ToolUse | None, Reply]:
        for responder in TEXT_RESPONDERS:
            text = responder(body)
            if text is not None:
                thought = "The user asked for an edit; I answer in the format they asked for."
                return "text", None, Reply(content=text, reasoning_content=thought)
        fmt = body.get("response_format")
        if isinstance(fmt, dict) and isinstance(fmt.get("json_schema"), dict):
            value = instance_of(fmt["json_schema"].get("schema"))
            return "json", None, Reply(content=orjson.dumps(value).decode())
        return "side", None, Reply(content="ok")
