"""The scripted model on its own: the tool it picks from each agent's schemas, the steps of
the task, and a break that lands exactly where it was asked for, once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.agents.scripted_model import (
    TEXT_RESPONDERS,
    BreakPoint,
    ScriptedModel,
    Task,
    find_task,
    instance_of,
    task_prompt,
)
from tests.agents.stream_layout import break_after, layout
from tests.agents.tool_choice import read_call, tools_of, write_call
from tests.fakes.common import JSON, Reply, parse_sse

PATH = "/work/space/hello.txt"
TEXT = "hello there"


def fn(name: str, props: dict[str, Any], required: list[str] | None = None) -> JSON:
    params = {"type": "object", "properties": props, "required": required or list(props)}
    return {"type": "function", "function": {"name": name, "parameters": params}}


S = {"type": "string"}
CLAUDE_CODE = [
    fn("Bash", {"command": S, "description": S, "timeout": {"type": "number"}}, ["command"]),
    fn("Glob", {"pattern": S, "path": S}, ["pattern"]),
    fn("Read", {"file_path": S, "offset": {"type": "number"}}, ["file_path"]),
    fn("Edit", {"file_path": S, "old_string": S, "new_string": S}),
    fn("Write", {"file_path": S, "content": S}),
]
CODEX = [
    fn("exec_command", {"cmd": S, "workdir": S, "yield_time_ms": {"type": "number"}}, ["cmd"]),
    fn("write_stdin", {"session_id": {"type": "number"}, "chars": S}, ["session_id"]),
    fn("view_image", {"path": S}),
]
CODEX_SHELL = [fn("shell", {"command": {"type": "array", "items": S}, "workdir": S}, ["command"])]
CODEX_PATCH = [*CODEX_SHELL, fn("apply_patch", {"input": S})]
QWEN = [
    fn("read_file", {"absolute_path": S, "offset": {"type": "number"}}, ["absolute_path"]),
    fn("write_file", {"file_path": S, "content": S}),
    fn("run_shell_command", {"command": S, "is_background": {"type": "boolean"}}, ["command"]),
]
OPENCODE = [
    fn("bash", {"command": S, "description": S}),
    fn("read", {"filePath": S, "offset": {"type": "number"}}, ["filePath"]),
    fn("write", {"content": S, "filePath": S}),
]
EDITOR = {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]}
RISK = {"type": "string", "enum": ["LOW", "MEDIUM", "HIGH"]}
OPENHANDS = [
    fn("terminal", {"command": S, "is_input": {"type": "boolean"}, "security_risk": RISK}),
    fn(
        "file_editor",
        {"command": EDITOR, "path": S, "file_text": S, "old_str": S, "security_risk": RISK},
        ["command", "path", "security_risk"],
    ),
]


@pytest.mark.parametrize(
    ("tools", "write", "read"),
    [
        (
            CLAUDE_CODE,
            ("Write", {"file_path": PATH, "content": TEXT}),
            ("Read", {"file_path": PATH}),
        ),
        (
            CODEX,
            ("exec_command", {"cmd": f"printf '%s' 'hello there' > {PATH}"}),
            ("exec_command", {"cmd": f"cat {PATH}"}),
        ),
        (
            CODEX_SHELL,
            ("shell", {"command": ["bash", "-lc", f"printf '%s' 'hello there' > {PATH}"]}),
            ("shell", {"command": ["bash", "-lc", f"cat {PATH}"]}),
        ),
        (
            CODEX_PATCH,
            (
                "apply_patch",
                {"input": f"*** Begin Patch\n*** Add File: {PATH}\n+{TEXT}\n*** End Patch\n"},
            ),
            ("shell", {"command": ["bash", "-lc", f"cat {PATH}"]}),
        ),
        (
            QWEN,
            ("write_file", {"file_path": PATH, "content": TEXT}),
            ("read_file", {"absolute_path": PATH}),
        ),
        (OPENCODE, ("write", {"filePath": PATH, "content": TEXT}), ("read", {"filePath": PATH})),
        (
            OPENHANDS,
            (
                "file_editor",
                {"command": "create", "path": PATH, "file_text": TEXT, "security_risk": "LOW"},
            ),
            ("file_editor", {"command": "view", "path": PATH, "security_risk": "LOW"}),
        ),
    ],
    ids=["claude-code", "codex", "codex-shell", "codex-patch", "qwen", "opencode", "openhands"],
)
def test_the_tool_is_chosen_from_the_schemas(
    tools: list[JSON], write: tuple[str, JSON], read: tuple[str, JSON]
) -> None:
    found = tools_of({"tools": tools})
    written = write_call(found, PATH, TEXT)
    assert written is not None and (written.name, written.arguments) == write
    reading = read_call(found, PATH)
    assert reading is not None and (reading.name, reading.arguments) == read


def test_a_tool_named_otherwise_is_still_found_by_its_properties() -> None:
    tools = tools_of(
        {"tools": [fn("save", {"target_file": S, "contents": S}), fn("sh", {"cmd": S})]}
    )
    use = write_call(tools, PATH, TEXT)
    assert use is not None and use.arguments == {"target_file": PATH, "contents": TEXT}
    reading = read_call(tools, PATH)
    assert reading is not None and reading.arguments == {"cmd": f"cat {PATH}"}
    assert write_call(tools_of({"tools": [fn("Glob", {"pattern": S})]}), PATH, TEXT) is None
    # a tool that replaces a part of a file is no writer, though it has a path and a text
    editing = tools_of(
        {"tools": [fn("change", {"path": S, "text": S, "old_str": S}), fn("sh", {"cmd": S})]}
    )
    use = write_call(editing, PATH, TEXT)
    assert use is not None and use.name == "sh"


def test_the_task_is_found_in_the_prompt() -> None:
    task = Task(PATH, TEXT)
    messages = [{"role": "system", "content": "x"}, {"role": "user", "content": task_prompt(task)}]
    assert find_task(messages) == (task, 1)
    parts = [{"type": "text", "text": "<reminder/>"}, {"type": "text", "text": task_prompt(task)}]
    assert find_task([{"role": "user", "content": parts}]) == (task, 0)
    assert find_task([{"role": "user", "content": "hello"}]) is None


def test_a_schema_gets_an_instance_that_fits_it() -> None:
    schema = {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "kind": {"enum": ["a", "b"]},
            "done": {"type": "boolean"},
        },
        "required": ["title"],
    }
    assert instance_of(schema) == {"title": "Create a file", "kind": "a", "done": False}


# ---------------------------------------------------------------------------- through HTTP


@pytest.fixture
def model_url() -> Iterator[tuple[ScriptedModel, str]]:
    model = ScriptedModel()
    with model.serve() as url:
        yield model, url


def chat(url: str, body: JSON) -> tuple[list[Any], bool]:
    """The stream's chunks, and whether it ended cleanly."""
    chunks: list[Any] = []
    raw = bytearray()
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=10) as r:
            for piece in r.iter_bytes():
                raw.extend(piece)
        whole = True
    except httpx.RemoteProtocolError:
        whole = False
    chunks = [c for c in parse_sse(bytes(raw)) if c != "[DONE]"]
    return chunks, whole


def label(chunk: JSON) -> str:
    if "prompt_progress" in chunk:
        return "progress"
    if not chunk["choices"]:
        return "usage"
    choice = chunk["choices"][0]
    delta = choice["delta"]
    if choice["finish_reason"]:
        return "finish"
    if delta.get("reasoning_content"):
        return "reasoning"
    if delta.get("content"):
        return "content"
    if "tool_calls" in delta:
        return "tool_head" if "id" in delta["tool_calls"][0] else "tool_args"
    return "role"


def ask(step_messages: list[JSON], tools: list[JSON] | None = None, **extra: Any) -> JSON:
    prompt = {"role": "user", "content": task_prompt(Task(PATH, TEXT))}
    return {
        "messages": [prompt, *step_messages],
        "tools": CLAUDE_CODE if tools is None else tools,
        "stream": True,
        "return_progress": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


def called(name: str, args: JSON) -> list[JSON]:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(args).decode()},
    }
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]


def test_the_task_takes_a_write_a_read_and_a_closing_text(
    model_url: tuple[ScriptedModel, str],
) -> None:
    model, url = model_url
    bodies = [
        ask([]),
        ask(called("Write", {"file_path": PATH, "content": TEXT})),
        ask(called("Write", {}) + called("Read", {"file_path": PATH})),
    ]
    for body in bodies:
        assert chat(url, body)[1]
    assert [(a.step, a.tool and a.tool.name) for a in model.answers] == [
        ("write", "Write"),
        ("read", "Read"),
        ("done", None),
    ]


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("per", [1, 3])
def test_the_layout_is_the_fakes_stream(thinking: bool, per: int) -> None:
    model = ScriptedModel(tokens_per_chunk=per)
    reply = Reply(
        content="I will write it now.",
        reasoning_content="The user wants a file written.",
        tool_calls=[{"name": "Write", "arguments": {"file_path": PATH, "content": TEXT}}],
    )
    model.fake.responder = lambda body: reply
    off: JSON = {} if thinking else {"chat_template_kwargs": {"enable_thinking": False}}
    body = ask([], **off)
    with model.serve() as url:
        chunks, whole = chat(url, body)
    assert whole
    expected = layout(reply, body, server_thinks=True, tokens_per_chunk=per)
    assert [label(c) for c in chunks] == expected
    assert ("reasoning" in expected) is thinking


# what the chunks before the break hold, for each point: (label of the last chunk sent,
# labels that must not have been sent)
LANDS = {
    BreakPoint.BEFORE_CONTENT: ("role", {"reasoning", "content", "tool_head"}),
    BreakPoint.IN_REASONING: ("reasoning", {"content"}),
    BreakPoint.IN_TEXT: ("content", {"tool_head"}),
    BreakPoint.BETWEEN_BLOCKS: ("content", {"tool_head"}),
    BreakPoint.IN_TOOL_ARGS: ("tool_args", {"finish"}),
    BreakPoint.AFTER_LAST_BLOCK: ("tool_args", {"finish"}),
}


@pytest.mark.parametrize("point", list(LANDS), ids=lambda p: p.value)
def test_the_break_lands_where_asked_and_only_once(point: BreakPoint) -> None:
    model = ScriptedModel(point)
    with model.serve() as url:
        chunks, whole = chat(url, ask([]))
        assert not whole
        again, whole_again = chat(url, ask([]))
    sent = [label(c) for c in chunks]
    last, unsent = LANDS[point]
    assert sent[-1] == last and not unsent & set(sent)
    full = [label(c) for c in again]
    assert whole_again and len(sent) < len(full) and full[: len(sent)] == sent
    if point is BreakPoint.IN_TEXT:
        assert sent.count("content") < full.count("content")
    if point is BreakPoint.IN_REASONING:
        assert sent.count("reasoning") < full.count("reasoning")
    if point is BreakPoint.IN_TOOL_ARGS:
        assert sent.count("tool_args") < full.count("tool_args")
    if point in (BreakPoint.BETWEEN_BLOCKS, BreakPoint.AFTER_LAST_BLOCK):
        kept = "content" if point is BreakPoint.BETWEEN_BLOCKS else "tool_args"
        assert sent.count(kept) == full.count(kept)
    assert model.broke is not None and model.broke.step == "write"
    assert [a.broke for a in model.answers] == [True, False]


def test_a_point_the_answer_lacks_breaks_a_later_answer() -> None:
    """With thinking off there is no reasoning: the break waits for an answer with some;
    an answer without a tool call has no point inside one."""
    chunks = layout(Reply(content="done"), {}, server_thinks=False, tokens_per_chunk=1)
    assert break_after(BreakPoint.IN_TOOL_ARGS, chunks) is None
    assert break_after(BreakPoint.IN_TEXT, chunks) is None  # a single piece of text
    assert break_after(BreakPoint.BETWEEN_BLOCKS, chunks) is None
    model = ScriptedModel(BreakPoint.IN_REASONING)
    off: JSON = {"chat_template_kwargs": {"enable_thinking": False}}
    with model.serve() as url:
        assert chat(url, ask([], **off))[1]
        assert not chat(url, ask([]))[1]
    assert [a.broke for a in model.answers] == [False, True]


def test_a_continuation_goes_on_with_the_same_answer(model_url: tuple[ScriptedModel, str]) -> None:
    model, url = model_url
    first, _ = chat(url, ask([]))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in first if c["choices"])
    partial = {"role": "assistant", "content": text[:10]}
    rest, whole = chat(
        url, ask([partial], continue_final_message=True, add_generation_prompt=False)
    )
    more = "".join(c["choices"][0]["delta"].get("content") or "" for c in rest if c["choices"])
    assert whole and text[:10] + more == text
    assert [a.step for a in model.answers] == ["write", "write"]


def test_side_calls_get_answers_that_fit(model_url: tuple[ScriptedModel, str]) -> None:
    model, url = model_url
    schema = {"type": "object", "properties": {"title": S}, "required": ["title"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    body = {"messages": [{"role": "user", "content": "name this"}], "response_format": fmt}
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=10).json()
    assert orjson.loads(answer["choices"][0]["message"]["content"]) == {"title": "Create a file"}
    quota = {"messages": [{"role": "user", "content": "quota"}], "max_tokens": 1}
    assert httpx.post(url + "/v1/chat/completions", json=quota, timeout=10).status_code == 200
    assert [a.step for a in model.answers] == ["json", "side"]


def test_a_request_without_tools_goes_to_the_text_responders(
    model_url: tuple[ScriptedModel, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, url = model_url
    responders = [lambda body: None, lambda body: "hello.txt\n```\nhi\n```"]
    monkeypatch.setattr("tests.agents.scripted_model.TEXT_RESPONDERS", responders)
    body = {"messages": [{"role": "user", "content": "edit"}]}
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=10).json()
    assert answer["choices"][0]["message"]["content"] == "hello.txt\n```\nhi\n```"
    assert model.answers[0].step == "text"
    assert TEXT_RESPONDERS is not responders  # the module's own list is left as it was
