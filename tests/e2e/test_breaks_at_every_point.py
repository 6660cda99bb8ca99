"""A stream that breaks once, at every point of an answer, on every front, with each
front's own SDK as the caller (docs/failures.md, "A break at each point").

On llama.cpp the caller gets one unbroken answer equal to the answer that did not
break (its tool calls whole, with the same arguments): what was shown is text and
reasoning only, because the relay holds tool calls back until the finish, and the
server goes on from there. On a cloud kind an answer that showed nothing yet (before
content, or tool calls alone) is sent again silently; one that showed text ends in
the failure the caller's own client retries: a chat error typed ``server_error``,
Anthropic's ``api_error``, ``response.failed``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai
import orjson
import pytest
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseFailedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseReasoningItem,
)

from tests.e2e.conftest import COMPAT_KEY, Gateway
from tests.e2e.every_kind import start_gateway_on
from tests.fakes.common import Reply, fragments
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.server import serve_in_thread, stop_all
from tests.outcomes import outcomes

REASONING = "The user wants two files. I will write both of them."
TEXT = "Writing the two files now."
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("write_file", {"path": "a.txt", "content": "hello"}),
    ("write_file", {"path": "b.txt", "content": "goodbye"}),
]
ASK = "Write a.txt and b.txt."
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
}
MAX_TOKENS = 400


def _arguments(i: int) -> str:
    return orjson.dumps(CALLS[i][1]).decode()


def _reply(answer: str, **fault: Any) -> Reply:
    calls = [{"name": n, "arguments": _arguments(i)} for i, (n, _) in enumerate(CALLS)]
    if answer == "calls":
        return Reply(content="", tool_calls=calls, **fault)
    if answer == "text":
        return Reply(content=TEXT, reasoning_content=REASONING, **fault)
    return Reply(content=TEXT, reasoning_content=REASONING, tool_calls=calls, **fault)


# -- where it breaks: chunks of the upstream's stream after its lead (llama.cpp's prompt
# progress), counted as both fakes stream an answer: the role chunk, one chunk per token of
# reasoning and of text, and per call its head, then one chunk per token of its arguments

_R, _T = len(fragments(REASONING)), len(fragments(TEXT))
_A0, _A1 = len(fragments(_arguments(0))), len(fragments(_arguments(1)))


@dataclass(frozen=True)
class Point:
    name: str
    answer: str  # "full" (reasoning, text, two calls), "calls" (two calls), "text"
    chunks: int
    # what the caller was shown when it broke, but for the tool calls the relay holds
    shows: bool
    # a thinking block had ended before the break (the Messages front)
    block_ended: bool = False


POINTS = [
    Point("before_content", "full", 1, shows=False),
    Point("in_reasoning", "full", 1 + 2, shows=True),
    Point("reasoning_to_text", "full", 1 + _R, shows=True),
    Point("in_text", "full", 1 + _R + 2, shows=True, block_ended=True),
    Point("text_to_tool_call", "full", 1 + _R + _T, shows=True, block_ended=True),
    Point("in_tool_arguments", "full", 1 + _R + _T + 1 + 2, shows=True, block_ended=True),
    Point("between_tool_calls", "full", 1 + _R + _T + 1 + _A0, shows=True, block_ended=True),
    Point(
        "in_second_tool_call", "full", 1 + _R + _T + 1 + _A0 + 1 + 1, shows=True, block_ended=True
    ),
    Point(
        "after_last_block",
        "full",
        1 + _R + _T + 1 + _A0 + 1 + _A1,
        shows=True,
        block_ended=True,
    ),
    Point("in_tool_arguments_alone", "calls", 1 + 1 + 2, shows=False),
    Point("after_last_tool_call_alone", "calls", 1 + 1 + _A0 + 1 + _A1, shows=False),
    Point("after_last_text", "text", 1 + _R + _T, shows=True, block_ended=True),
]


@dataclass(frozen=True)
class Kind:
    profile: str
    lead: int
    continues: bool


KINDS = [Kind("local", lead=2, continues=True), Kind("cloud", lead=0, continues=False)]


# -- what a caller ends with


@dataclass
class Answer:
    reasoning: str = ""
    text: str = ""
    calls: list[tuple[str, Any]] = field(default_factory=list)


@dataclass
class Failure:
    """The error the caller's SDK raised or ended with, and what it had seen."""

    kind: str
    code: str | None
    block_ended: bool


Outcome = Answer | Failure
Caller = Callable[[Gateway, str], Outcome]


def chat(gw: Gateway, model: str) -> Outcome:
    tools = [{"type": "function", "function": {"name": "write_file", "parameters": SCHEMA}}]
    got = Answer()
    calls: dict[int, list[str]] = {}
    roles, ids = 0, set()
    stream: Any = gw.client().chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": ASK}],
        tools=tools,  # type: ignore[arg-type]
        stream=True,
        max_tokens=MAX_TOKENS,
    )
    try:
        for chunk in stream:
            ids.add(chunk.id)
            for choice in chunk.choices:
                delta = choice.delta
                roles += 1 if delta.role else 0
                got.text += delta.content or ""
                got.reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
                for tc in delta.tool_calls or ():
                    slot = calls.setdefault(tc.index, ["", ""])
                    slot[0] += (tc.function.name if tc.function else None) or ""
                    slot[1] += (tc.function.arguments if tc.function else None) or ""
    except openai.APIError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return Failure(str(body.get("type")), body.get("code"), False)
    assert roles == 1 and len(ids) == 1  # one answer, never a second glued to it
    got.calls = [(n, orjson.loads(a)) for n, a in (calls[i] for i in sorted(calls))]
    return got


def messages(gw: Gateway, model: str) -> Outcome:
    client = anthropic.Anthropic(
        base_url=gw.url,
        api_key="unused",
        max_retries=0,
        default_headers={"anthropic-version": "2023-06-01"},
    )
    seen: list[str] = []
    try:
        with client.messages.stream(
            model=model,
            max_tokens=MAX_TOKENS,
            messages=[{"role": "user", "content": ASK}],
            tools=[{"name": "write_file", "input_schema": SCHEMA}],
        ) as stream:
            for event in stream:
                seen.append(event.type)
            message = stream.get_final_message()
    except anthropic.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        error: Any = body.get("error")
        kind = error.get("type") if isinstance(error, dict) else None
        return Failure(str(kind), None, "content_block_stop" in seen)
    finally:
        client.close()
    got = Answer()
    for block in message.content:
        if block.type == "thinking":
            got.reasoning += block.thinking
        elif block.type == "text":
            got.text += block.text
        elif block.type == "tool_use":
            got.calls.append((block.name, block.input))
    return got


def responses(gw: Gateway, model: str) -> Outcome:
    tools: Any = [{"type": "function", "name": "write_file", "parameters": SCHEMA, "strict": False}]
    events = list(
        gw.client().responses.create(
            model=model,
            input=ASK,
            tools=tools,
            stream=True,
            max_output_tokens=MAX_TOKENS,
        )
    )
    last = events[-1]
    if isinstance(last, ResponseFailedEvent):
        error = last.response.error
        assert error is not None
        return Failure(str(error.type), str(error.code), False)
    assert isinstance(last, ResponseCompletedEvent), last
    got = Answer()
    for item in last.response.output:
        if isinstance(item, ResponseReasoningItem):
            got.reasoning += "".join(c.text for c in item.content or ())
        elif isinstance(item, ResponseOutputMessage):
            got.text += "".join(getattr(c, "text", "") for c in item.content)
        elif isinstance(item, ResponseFunctionToolCall):
            got.calls.append((item.name, orjson.loads(item.arguments)))
    return got


@dataclass(frozen=True)
class Front:
    name: str
    caller: Caller
    # the failure its SDK ends with: (kind, code)
    failure: tuple[str, str | None]


FRONTS = [
    Front("chat", chat, ("server_error", "upstream_stream_broken")),
    Front("messages", messages, ("api_error", None)),
    Front("responses", responses, ("server_error", "upstream_stream_broken")),
]


# -- the gateway and its two upstreams


@dataclass
class Fakes:
    llama: FakeLlamaServer
    cloud: FakeOpenAI
    urls: tuple[str, str]

    def of(self, kind: Kind) -> FakeLlamaServer | FakeOpenAI:
        return self.llama if kind.continues else self.cloud


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    # one prompt-progress chunk at the start and one at the end, whatever the prompt
    llama = FakeLlamaServer(progress_batch=1_000_000)
    # a cloud service that streams its reasoning (DeepSeek's way)
    cloud = FakeOpenAI(
        api_key=COMPAT_KEY, models={"deep-1"}, path_prefix="/v1", returns_reasoning_content=True
    )
    servers = [serve_in_thread(f.app) for f in (llama, cloud)]
    try:
        yield Fakes(llama, cloud, (servers[0].url, servers[1].url))
    finally:
        stop_all(servers)


@pytest.fixture(scope="module")
def gateway(fakes: Fakes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    profiles = {
        "local": {
            "provider": "local",
            "external_url": fakes.urls[0],
            # nothing else may take a scripted answer between the two sends
            "server": {"cache_repair": False},
        },
        "cloud": {
            "provider": "openai-compatible",
            "model": "deep-1",
            "api_key_env": "BREAKS_CLOUD_KEY",
            "base_url": fakes.urls[1] + "/v1",
        },
    }
    os.environ["BREAKS_CLOUD_KEY"] = COMPAT_KEY
    gw = start_gateway_on(tmp_path_factory.mktemp("gw"), profiles)
    yield gw
    gw.stop()


def ask(gw: Gateway, fakes: Fakes, front: Front, kind: Kind, *replies: Reply) -> Outcome:
    fake = fakes.of(kind)
    fake.replies.clear()
    fake.queue(*replies)
    return front.caller(gw, kind.profile)


@pytest.mark.parametrize("kind", KINDS, ids=[k.profile for k in KINDS])
@pytest.mark.parametrize("point", POINTS, ids=[p.name for p in POINTS])
@pytest.mark.parametrize("front", FRONTS, ids=[f.name for f in FRONTS])
def test_a_break_at_each_point(
    gateway: Gateway, fakes: Fakes, front: Front, point: Point, kind: Kind
) -> None:
    whole = ask(gateway, fakes, front, kind, _reply(point.answer))
    assert isinstance(whole, Answer)
    assert whole.calls == ([] if point.answer == "text" else CALLS)
    assert whole.text == ("" if point.answer == "calls" else TEXT)

    broken = _reply(point.answer, break_after_chunks=kind.lead + point.chunks)
    got = ask(gateway, fakes, front, kind, broken, _reply(point.answer))
    call = gateway.calls()[-1]
    assert outcomes(call["attempt_log"])[0] == {"status": 502, "code": "upstream_stream_broken"}
    if kind.continues or not point.shows:
        assert got == whole  # one unbroken answer, its calls whole with the same arguments
        assert call["status"] == "ok" and call["retried"] is True
        assert outcomes(call["attempt_log"])[1:] == [{"status": 200, "code": None}]
        continued = call["adjustments"].get("continued_after_break")
        assert continued is (True if point.shows else None)
        return
    assert isinstance(got, Failure)
    assert (got.kind, got.code) == front.failure
    if front.name == "messages":
        # Claude Code 2.1.197 resends unless a block had ended: only a thinking block can
        assert got.block_ended is point.block_ended
    assert call["status"] == "error" and call["error_code"] == "upstream_stream_broken"
    assert call["retried"] is False and len(call["attempt_log"]) == 1


@pytest.mark.parametrize("front", FRONTS, ids=[f.name for f in FRONTS])
def test_a_continuation_that_breaks_too_ends_in_the_failure_the_caller_retries(
    gateway: Gateway, fakes: Fakes, front: Front
) -> None:
    """Nothing can go on after a second break: the caller gets its front's failure."""
    local = KINDS[0]
    in_text = next(p for p in POINTS if p.name == "in_text")
    first = _reply("full", break_after_chunks=local.lead + in_text.chunks)
    # the continuation breaks too: its role chunk is dropped, two more tokens shown
    again = _reply("full", break_after_chunks=local.lead + 1 + 2)
    got = ask(gateway, fakes, front, local, first, again, _reply("full"))
    assert isinstance(got, Failure)
    assert (got.kind, got.code) == front.failure
    call = gateway.calls()[-1]
    assert call["status"] == "error" and call["error_code"] == "upstream_stream_broken"
    assert call["adjustments"]["continued_after_break"] is False
    assert [a["status"] for a in call["attempt_log"]] == [502, 502]
