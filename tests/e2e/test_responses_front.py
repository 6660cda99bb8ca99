"""The Responses API front with the openai SDK's responses client as the caller.

A Codex-shaped tool loop on the fake llama-server, its reasoning given back through
``encrypted_content`` or, when the caller drops the reasoning items, by the gateway's
reasoning store; whole and streamed answers alike; errors as the SDK's exceptions;
what is refused; and every event and response read by the SDK's own types.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionToolCall,
)

from boundedcode_gateway.config import ReasoningSettings
from boundedcode_gateway.fronts.sealing import KEY_FILE
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply
from tests.responses_sdk import EVENT_CLASSES, check_response, check_stream

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
INSTRUCTIONS = "You are a coding agent. " * 10
# four tool-call turns, each with its reasoning, then the answer
TURNS = [
    *(
        Reply(
            content="",
            reasoning_content=f"Step {i}: the next file to read is f{i}.py. " * 3,
            tool_calls=[{"name": "read_file", "arguments": {"path": f"f{i}.py"}}],
        )
        for i in range(4)
    ),
    Reply(content="All four files are read.", reasoning_content="Nothing is left to read. " * 3),
]
REASONING = {t.reasoning_content for t in TURNS}

Ask = Callable[[openai.OpenAI, list[Any]], Response]


def create(client: openai.OpenAI, items: list[Any]) -> Response:
    return client.responses.create(
        model="local", instructions=INSTRUCTIONS, input=items, tools=TOOLS, store=False
    )


def stream_events(client: openai.OpenAI, items: list[Any]) -> Response:
    """``stream=True``: every event is the SDK's class of its type; the last one holds the
    response."""
    events = list(
        client.responses.create(
            model="local", instructions=INSTRUCTIONS, input=items, tools=TOOLS, stream=True
        )
    )
    for event in events:
        assert type(event) is EVENT_CLASSES[event.type], event
    assert [e.sequence_number for e in events] == list(range(len(events)))
    last = events[-1]
    assert isinstance(last, ResponseCompletedEvent)
    return last.response


def stream_helper(client: openai.OpenAI, items: list[Any]) -> Response:
    with client.responses.stream(
        model="local", instructions=INSTRUCTIONS, input=items, tools=TOOLS
    ) as stream:
        return stream.get_final_response()


ASKS: dict[str, Ask] = {"create": create, "stream": stream_events, "helper": stream_helper}


def answered(answer: Response, keep_reasoning: bool, output: str) -> list[Any]:
    """The input items the caller adds after ``answer``: its output items (the reasoning
    items only when ``keep_reasoning``), and each function call's ``output``."""
    items: list[Any] = []
    for item in answer.output:
        if item.type == "reasoning" and not keep_reasoning:
            continue
        items.append(item.model_dump(exclude_none=True))
        if isinstance(item, ResponseFunctionToolCall):
            items.append(
                {"type": "function_call_output", "call_id": item.call_id, "output": output}
            )
    return items


def tool_loop(
    gw: Gateway | Callable[[int], Gateway],
    upstreams: Upstreams,
    ask: Ask,
    keep_reasoning: bool,
    task: Callable[[int], str],
) -> list[Response]:
    """Five turns as Codex runs them with store false: the whole input each time, the
    answer's items appended (its reasoning items only when ``keep_reasoning``) and each
    function call's output; ``gw``: the gateway, or the gateway of each turn."""
    upstreams.llama.queue(*TURNS)
    items: list[Any] = [{"role": "user", "content": "Read the four files."}]
    answers = []
    for turn in range(len(TURNS)):
        served_by = gw if isinstance(gw, Gateway) else gw(turn)
        answer = ask(served_by.client(task=task(turn)), items)
        answers.append(answer)
        items += answered(answer, keep_reasoning, f"contents of file {turn}")
    return answers


def sent_reasoning(upstreams: Upstreams) -> list[list[str | None]]:
    """Per request the llama-server got: the reasoning of each earlier assistant turn."""
    return [
        [m.get("reasoning_content") for m in r.body["messages"] if m["role"] == "assistant"]
        for r in upstreams.llama.requests
        if r.method == "POST" and r.path.endswith("/chat/completions")
    ]


def sharing_the_key_file(
    start_gateway: GatewayFactory, upstreams: Upstreams, shared: Path, n: int
) -> list[Gateway]:
    """``n`` gateways, each with a data folder (and a reasoning store) of its own, all with
    the key file of the first."""
    gateways = [start_gateway(upstreams.profiles, data_dir=shared / "0")]
    for i in range(1, n):
        (shared / str(i)).mkdir(parents=True)
        copy = shared / str(i) / KEY_FILE
        copy.write_bytes((shared / "0" / KEY_FILE).read_bytes())
        copy.chmod(0o600)  # a key others may read stops the start
        gateways.append(start_gateway(upstreams.profiles, data_dir=shared / str(i)))
    return gateways


@pytest.mark.parametrize("ask", ASKS, ids=list(ASKS))
def test_reasoning_comes_back_from_encrypted_content(
    upstreams: Upstreams, start_gateway: GatewayFactory, tmp_path: Path, ask: str
) -> None:
    # a gateway per turn, each with its own store: the store has nothing to give, the
    # seals (bound to the task, which stays the same) all of it
    gateways = sharing_the_key_file(start_gateway, upstreams, tmp_path / "shared", len(TURNS))
    answers = tool_loop(gateways.__getitem__, upstreams, ASKS[ask], True, lambda _: "sealed")
    for answer, turn in zip(answers, TURNS, strict=True):
        reasoning = answer.output[0]
        assert reasoning.type == "reasoning" and reasoning.encrypted_content
        assert reasoning.content is not None and reasoning.content[0].text == turn.reasoning_content
    sent = sent_reasoning(upstreams)
    assert [len(s) for s in sent] == [0, 1, 2, 3, 4]
    for per_request in sent:
        assert per_request == [t.reasoning_content for t in TURNS[: len(per_request)]]
    calls = [c for gw in gateways for c in gw.calls() if c["task"] == "sealed"]
    assert {c["front"] for c in calls} == {"responses"}
    # each turn's prompt matched the server's cache up to what was new
    for call in calls[1:]:
        assert call["evaluated_tokens"] < 40, calls
    assert answers[-1].output_text == "All four files are read."
    assert [o.type for o in answers[0].output] == ["reasoning", "function_call"]


def test_dropped_reasoning_items_come_back_from_the_store(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    tool_loop(gateway, upstreams, create, False, lambda turn: "dropped")
    for per_request in sent_reasoning(upstreams):
        assert per_request == [t.reasoning_content for t in TURNS[: len(per_request)]]
    for call in [c for c in gateway.calls() if c["task"] == "dropped"][1:]:
        assert call["evaluated_tokens"] < 40


def test_without_seals_or_the_store_no_reasoning_goes_back(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    """The control of the two above: the reasoning they saw came from the seals and the
    store, not from anywhere else."""
    tool_loop(gateway, upstreams, create, False, lambda turn: f"bare-{turn}")
    assert all(r is None for per_request in sent_reasoning(upstreams) for r in per_request)


def test_a_seal_of_another_gateway_key_is_dropped(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    first = start_gateway(upstreams.profiles)
    second = start_gateway(upstreams.profiles)
    upstreams.llama.queue(TURNS[0], TURNS[4])
    items: list[Any] = [{"role": "user", "content": "Read."}]
    answer = create(first.client(task="one"), items)
    create(second.client(task="one"), items + answered(answer, True, "x"))
    assert sent_reasoning(upstreams)[-1] == [None]


@pytest.mark.parametrize(("task", "opened"), [("one", True), ("two", False)])
def test_gateways_sharing_the_key_file_open_each_others_seals_for_their_task(
    upstreams: Upstreams, start_gateway: GatewayFactory, tmp_path: Any, task: str, opened: bool
) -> None:
    """The second gateway's store is empty: what comes back comes from the seal, which
    opens in a call of the task it was made in only."""
    shared = tmp_path / "shared"
    first = start_gateway(upstreams.profiles, data_dir=shared / "a")
    (shared / "b").mkdir(parents=True)
    copy = shared / "b" / "front-seal.key"
    copy.write_bytes((shared / "a" / "front-seal.key").read_bytes())
    copy.chmod(0o600)  # as `cp` keeps it: a key others may read stops the start
    second = start_gateway(upstreams.profiles, data_dir=shared / "b")
    upstreams.llama.queue(TURNS[0], TURNS[4])
    items: list[Any] = [{"role": "user", "content": "Read."}]
    answer = create(first.client(task="one"), items)
    create(second.client(task=task), items + answered(answer, True, "x"))
    expected = TURNS[0].reasoning_content if opened else None
    assert sent_reasoning(upstreams)[-1] == [expected]


def raw_stream(gw: Gateway, body: dict[str, Any], headers: dict[str, str] | None = None) -> bytes:
    with httpx.Client(timeout=30) as http:
        reply = http.post(gw.url + "/v1/responses", json=body, headers=headers or {})
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/event-stream")
    return reply.content


def comparable(response: dict[str, Any]) -> dict[str, Any]:
    """What two answers to the same request share: not their ids, times and seals."""
    output = [
        {k: v for k, v in item.items() if k not in ("id", "encrypted_content")}
        for item in response["output"]
    ]
    skip = ("id", "created_at", "completed_at")
    return {**{k: v for k, v in response.items() if k not in skip}, "output": output}


@pytest.mark.parametrize("profile", ["local", "other", "gpt", "glm"])
def test_streamed_and_whole_answers_agree(
    gateway: Gateway, upstreams: Upstreams, profile: str
) -> None:
    fake: Any = {
        "local": upstreams.llama,
        "other": upstreams.other_local,
        "gpt": upstreams.openai,
        "glm": upstreams.compat,
    }[profile]
    reply = Reply(
        content="Reading it now.",
        reasoning_content="The file may hold the answer." if profile == "local" else None,
        tool_calls=[{"id": "call_a", "name": "read_file", "arguments": {"path": "a.py"}}],
    )
    fake.queue(reply, reply)
    body = {"model": profile, "input": "Read a.py", "tools": TOOLS, "instructions": "Be brief."}
    with httpx.Client(timeout=30) as http:
        whole = http.post(gateway.url + "/v1/responses", json=body).json()
    if profile in ("local", "other"):
        fake.reset_cache()  # the second answer is read as the first was, not from the cache
    events = check_stream(raw_stream(gateway, {**body, "stream": True}))
    streamed = events[-1]["response"]
    check_response(whole)
    assert comparable(streamed) == comparable(whole)
    kinds = ["reasoning"] * (profile == "local") + ["message", "function_call"]
    assert [i["type"] for i in whole["output"]] == kinds
    assert whole["usage"]["input_tokens"] > 0 and whole["usage"]["output_tokens"] > 0
    assert whole["instructions"] == "Be brief." and whole["tools"][0]["name"] == "read_file"
    rows = gateway.ledger_rows()[-2:]
    assert [r["front"] for r in rows] == ["responses", "responses"]


def test_what_is_sent_upstream(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.openai.queue(Reply(content='{"ok": true}'))
    gateway.client().responses.create(
        model="gpt",
        input=[
            {"role": "developer", "content": "Answer in JSON."},
            {"role": "user", "content": "ok?"},
        ],
        max_output_tokens=200,
        temperature=0.3,
        reasoning={"effort": "low", "summary": "auto"},
        text={
            "format": {
                "type": "json_schema",
                "name": "ok",
                "schema": {
                    "type": "object",
                    "properties": {"ok": {"type": "boolean"}},
                    "required": ["ok"],
                    "additionalProperties": False,
                },
                "strict": True,
            }
        },
        include=["reasoning.encrypted_content"],
        prompt_cache_key="abc",
        metadata={"run": "1"},
        store=True,
    )
    sent = upstreams.openai.requests.last.body
    assert sent["messages"] == [
        {"role": "developer", "content": "Answer in JSON."},
        {"role": "user", "content": "ok?"},
    ]
    assert sent["max_completion_tokens"] == 200 and sent["temperature"] == 0.3
    assert sent["reasoning_effort"] == "low"
    assert sent["response_format"]["json_schema"]["name"] == "ok"
    for absent in ("store", "metadata", "prompt_cache_key", "include"):
        assert absent not in sent


def test_a_cut_answer_is_incomplete(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.openai.queue(Reply(content="A long answer cut short", finish_reason="length"))
    answer = gateway.client().responses.create(model="gpt", input="Go on", max_output_tokens=5)
    assert answer.status == "incomplete"
    assert answer.incomplete_details is not None
    assert answer.incomplete_details.reason == "max_output_tokens"


def test_errors_are_the_sdk_exceptions(gateway: Gateway, upstreams: Upstreams) -> None:
    client = gateway.client()
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="nope", input="hi")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as builtin:
        client.responses.create(
            model="local",
            input="hi",
            tools=[{"type": "web_search_preview"}, *TOOLS],
            tool_choice={"type": "web_search_preview"},
        )
    assert builtin.value.param == "tool_choice"
    assert "'web_search_preview'" in builtin.value.message
    assert builtin.value.code == "unsupported_value"
    with pytest.raises(openai.BadRequestError) as previous:
        client.responses.create(model="local", input="hi", previous_response_id="resp_1")
    assert previous.value.param == "previous_response_id"
    assert "keeps no responses" in previous.value.message
    assert previous.value.body == {
        "message": previous.value.body["message"],  # type: ignore[index]
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }
    # refused requests are recorded under this front
    refused = gateway.calls()[-3:]
    assert [c["front"] for c in refused] == ["responses"] * 3
    assert [c["http_status"] for c in refused] == [404, 400, 400]
    # nothing is stored, so nothing can be fetched
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_1")


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_too_long_is_context_length_exceeded(
    gateway: Gateway, upstreams: Upstreams, stream: bool
) -> None:
    upstreams.llama.n_ctx = 16
    with pytest.raises(openai.BadRequestError) as info:
        gateway.client().responses.create(model="local", input="word " * 40, stream=stream)
    assert info.value.code == "context_length_exceeded"
    assert gateway.calls()[-1]["error_code"] == "context_length_exceeded"


def test_a_stream_that_breaks_after_text_shows_fails(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    """A caller that did not declare the discard event gets response.failed with the
    gateway's code, never a second answer (the tool call, held until the finish, was
    never shown)."""
    call = [{"name": "read_file", "arguments": {"path": "a.py"}}]
    upstreams.openai.queue(Reply(content="Reading.", tool_calls=call, break_after_chunks=5))
    events = list(
        gateway.client().responses.create(model="gpt", input="Read", tools=TOOLS, stream=True)
    )
    assert isinstance(events[-2], ResponseErrorEvent) and isinstance(
        events[-1], ResponseFailedEvent
    )
    assert events[-2].code == "upstream_stream_broken"
    assert events[-1].response.error is not None
    assert events[-1].response.error.code == "upstream_stream_broken"  # type: ignore[comparison-overlap]
    assert [e.type for e in events].count("response.output_item.added") == 1
    upstreams.openai.queue(Reply(content="Reading.", tool_calls=call, break_after_chunks=5))
    client = gateway.client()
    with (
        pytest.raises(RuntimeError, match=r"response\.completed"),
        client.responses.stream(model="gpt", input="Read", tools=TOOLS) as stream,
    ):
        stream.get_final_response()
    assert gateway.calls()[-1]["error_code"] == "upstream_stream_broken"


def test_the_task_form_of_the_path(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.openai.queue(Reply(content="Fine."))
    client = openai.OpenAI(base_url=gateway.url + "/tasks/t-42/v1", api_key="unused", max_retries=0)
    gateway.clients.append(client)
    assert client.responses.create(model="gpt", input="How are you?").output_text == "Fine."
    call = gateway.calls()[-1]
    assert (call["task"], call["front"]) == ("t-42", "responses")


CODEX_FIXTURES = Path(__file__).parents[1] / "fixtures" / "codex"


@pytest.mark.parametrize("stream", [False, True])
def test_codex_s_own_request_and_a_namespaced_call(
    gateway: Gateway, upstreams: Upstreams, stream: bool
) -> None:
    """Codex 0.171.0's first request as it sent it (its default tools: functions, the
    ``multi_agent_v1`` namespace, ``web_search``), the model calling a function of the
    namespace: the call comes back by its namespace, the record says what was left out."""
    request = orjson.loads((CODEX_FIXTURES / "responses_first_turn.json").read_bytes())
    request["stream"] = stream
    # Codex's instructions and tools are some 15,000 tokens
    upstreams.llama.n_ctx = 65536
    upstreams.llama.queue(
        Reply(
            content="",
            tool_calls=[
                {
                    "id": "call_w1",
                    "name": "multi_agent_v1__wait_agent",
                    "arguments": {"targets": ["a1"]},
                },
                {"id": "call_x1", "name": "exec_command", "arguments": {"cmd": "ls"}},
            ],
        )
    )
    # sent as Codex sends it, every field of it (the SDK has no client_metadata)
    if stream:
        events = check_stream(raw_stream(gateway, request))
        done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert [(i["name"], i.get("namespace")) for i in done] == [
            ("wait_agent", "multi_agent_v1"),
            ("exec_command", None),
        ]
        assert events[-1]["type"] == "response.completed"
        answer = check_response(events[-1]["response"])
    else:
        with httpx.Client(timeout=30) as http:
            reply = http.post(gateway.url + "/v1/responses", json=request)
        assert reply.status_code == 200, reply.text
        answer = check_response(reply.json())
    calls = [i for i in answer.output if isinstance(i, ResponseFunctionToolCall)]
    assert [(c.name, c.namespace, c.call_id, c.arguments) for c in calls] == [
        ("wait_agent", "multi_agent_v1", "call_w1", '{"targets":["a1"]}'),
        ("exec_command", None, "call_x1", '{"cmd":"ls"}'),
    ]
    sent = upstreams.llama.requests.last.body
    names = [t["function"]["name"] for t in sent["tools"]]
    assert "multi_agent_v1__wait_agent" in names and "exec_command" in names
    assert len(names) == 12
    call = gateway.calls()[-1]
    assert (call["front"], call["http_status"], call["error_code"]) == ("responses", 200, None)
    assert call["adjustments"]["tools_dropped"] == ["web_search"]
    assert call["adjustments"]["tools_flattened"] == ["multi_agent_v1"]


# a seal older than this (2 s) is refused where the setting is in force
SHORT_SEAL_AGE_DAYS = 2 / 86400


@pytest.mark.parametrize("when", ["at-start", "by-a-reload"])
def test_the_configured_seal_age_is_the_one_a_gateway_holds_seals_to(
    upstreams: Upstreams, start_gateway: GatewayFactory, tmp_path: Any, when: str
) -> None:
    """The second gateway's store is empty: the seal alone could give the reasoning back,
    and ``reasoning.seal_max_age_days``, set in its configuration at start or by a reload,
    refuses it once older than that."""
    shared = tmp_path / "shared"
    first = start_gateway(upstreams.profiles, data_dir=shared / "a")
    (shared / "b").mkdir(parents=True)
    copy = shared / "b" / "front-seal.key"
    copy.write_bytes((shared / "a" / "front-seal.key").read_bytes())
    copy.chmod(0o600)
    short = {"seal_max_age_days": SHORT_SEAL_AGE_DAYS}
    if when == "at-start":
        second = start_gateway(upstreams.profiles, data_dir=shared / "b", reasoning=short)
    else:
        second = start_gateway(upstreams.profiles, data_dir=shared / "b")
        app = second.app
        reasoning = ReasoningSettings(seal_max_age_days=SHORT_SEAL_AGE_DAYS)
        config = app.config.model_copy(update={"reasoning": reasoning})
        assert app.loop is not None
        result = asyncio.run_coroutine_threadsafe(app.reload(config), app.loop).result(60)
        assert result.applied, result.reason
    upstreams.llama.queue(TURNS[0], TURNS[4], TURNS[4])
    items: list[Any] = [{"role": "user", "content": "Read."}]
    answer = create(first.client(task="one"), items)
    # at once, the seal opens: the setting refuses only what is older than it
    create(second.client(task="one"), items + answered(answer, True, "x"))
    assert sent_reasoning(upstreams)[-1] == [TURNS[0].reasoning_content]
    # a seal's time is in whole seconds, and refused once more than the age has passed:
    # 2.5 s later is 2 whole seconds later where the seal was made early in its second
    time.sleep(SHORT_SEAL_AGE_DAYS * 86400 + 1.5)
    create(second.client(task="one"), items + answered(answer, True, "x"))
    assert sent_reasoning(upstreams)[-1] == [None]
