"""Off-the-shelf callers meet a stream that breaks after content, on every provider kind.

A caller that declared it understands the discard event ends with exactly the
answer sent again; any other caller gets an exception and never a second answer
glued to the first — no doubled text, no tool call merged out of two. A break inside
a tool call of an answer that showed nothing else has shown nothing (the relay holds
tool calls until the finish): every caller gets the answer sent again, whole.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import openai
import orjson
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from tests.e2e.conftest import Gateway
from tests.e2e.every_kind import (
    ANSWER,
    ASK,
    AWARE,
    CALLS,
    KINDS,
    TOOLS,
    Fakes,
    Kind,
    fakes,
    start_gateway_on,
)

# LiteLLM fetches a price list over the network when imported unless told not to
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
import litellm

__all__ = ["fakes"]  # the module-scoped fixture


@pytest.fixture(scope="module")
def gateway(fakes: Fakes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data_dir = tmp_path_factory.mktemp("gw")
    gw = start_gateway_on(data_dir, fakes.profiles)
    yield gw
    gw.stop()


@pytest.fixture(params=KINDS, ids=[k.profile for k in KINDS])
def kind(request: pytest.FixtureRequest, fakes: Fakes) -> Kind:
    fakes.reset()
    return request.param  # type: ignore[no-any-return]


@dataclass
class Seen:
    """What a caller assembled: text and tool calls (name, arguments text) by index."""

    text: str = ""
    calls: dict[int, list[str]] = field(default_factory=dict)
    discards: int = 0

    def add_call(self, index: int, name: str | None, arguments: str | None) -> None:
        slot = self.calls.setdefault(index, ["", ""])
        slot[0] += name or ""
        slot[1] += arguments or ""

    def parsed_calls(self) -> list[tuple[str, Any]]:
        return [(n, orjson.loads(a)) for n, a in (self.calls[i] for i in sorted(self.calls))]


# -- the callers: each fills ``seen`` as it goes and returns it, or raises


def _is_discard(extra: dict[str, Any] | None) -> bool:
    ext = (extra or {}).get("boundedcode")
    return isinstance(ext, dict) and ext.get("event") == "discard"


def sdk_create(gw: Gateway, model: str, tools: bool, aware: bool, seen: Seen) -> Seen:
    """``create(stream=True)``, iterated and assembled by index as most agents do."""
    client = gw.client()
    extra: dict[str, Any] = {"tools": TOOLS} if tools else {}
    headers = AWARE if aware else {}
    stream = client.chat.completions.create(
        model=model, messages=ASK, stream=True, extra_headers=headers, **extra
    )
    for chunk in stream:
        if aware and _is_discard(chunk.model_extra):
            seen.text, seen.calls = "", {}
            seen.discards += 1
            continue
        for choice in chunk.choices:
            seen.text += choice.delta.content or ""
            for tc in choice.delta.tool_calls or ():
                fn = tc.function
                seen.add_call(tc.index, fn.name if fn else None, fn.arguments if fn else None)
    return seen


def _from_completion(completion: Any, seen: Seen) -> Seen:
    message = completion.choices[0].message
    seen.text = message.content or ""
    for i, call in enumerate(message.tool_calls or ()):
        seen.calls[i] = [call.function.name, call.function.arguments]
    return seen


def sdk_accumulator(gw: Gateway, model: str, tools: bool, aware: bool, seen: Seen) -> Seen:
    """The SDK's own accumulation and ``get_final_completion()``.

    Unaware: ``client.chat.completions.stream(...)``. Aware: the same accumulator the
    helper uses (``ChatCompletionStreamState``), started afresh at a discard chunk.
    """
    client = gw.client()
    extra: dict[str, Any] = {"tools": TOOLS} if tools else {}
    if not aware:
        with client.chat.completions.stream(model=model, messages=ASK, **extra) as s:
            for event in s:
                if event.type == "content.delta":
                    seen.text += event.delta
            return _from_completion(s.get_final_completion(), seen)
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(
        model=model, messages=ASK, stream=True, extra_headers=AWARE, **extra
    ):
        if _is_discard(chunk.model_extra):
            state = ChatCompletionStreamState()
            seen.discards += 1
            continue
        state.handle_chunk(chunk)
    return _from_completion(state.get_final_completion(), seen)


def litellm_stream(gw: Gateway, model: str, tools: bool, aware: bool, seen: Seen) -> Seen:
    """LiteLLM's streaming wrapper, the path the OpenHands agent takes."""
    extra: dict[str, Any] = {"tools": TOOLS} if tools else {}
    if aware:
        extra["extra_headers"] = AWARE
    chunks = []
    for chunk in litellm.completion(
        model=f"openai/{model}",
        api_base=gw.url + "/v1",
        api_key="unused",
        messages=ASK,
        stream=True,
        num_retries=0,
        **extra,
    ):
        chunks.append(chunk)
        for choice in chunk.choices:
            seen.text += choice.delta.content or ""
    return _from_completion(litellm.stream_chunk_builder(chunks), seen)


Caller = Callable[[Gateway, str, bool, bool, Seen], Seen]
# LiteLLM never hands its caller a chunk without choices, so it cannot honour the event
AWARE_CALLERS: list[Caller] = [sdk_create, sdk_accumulator]
UNAWARE_CALLERS: list[Caller] = [sdk_create, sdk_accumulator, litellm_stream]


def _queue(kind: Kind, fakes: Fakes, tools: bool) -> None:
    (kind.queue_tools if tools else kind.queue_text)(fakes)


def _expected(seen: Seen, tools: bool) -> None:
    if tools:
        assert seen.parsed_calls() == CALLS
    else:
        assert seen.text == ANSWER


@pytest.mark.parametrize("caller", AWARE_CALLERS, ids=[c.__name__ for c in AWARE_CALLERS])
@pytest.mark.parametrize("tools", [False, True], ids=["text", "tool_calls"])
def test_an_aware_caller_ends_with_exactly_the_answer_sent_again(
    gateway: Gateway, fakes: Fakes, kind: Kind, caller: Caller, tools: bool
) -> None:
    _queue(kind, fakes, tools)
    seen = caller(gateway, kind.profile, tools, True, Seen())
    _expected(seen, tools)
    # continued, or (tool calls held back) nothing was shown
    unseen = (kind.continues_text and not tools) or tools
    assert seen.discards == (0 if unseen else 1)
    call = gateway.calls()[-1]
    assert call["status"] == "ok" and call["retried"] is True


@pytest.mark.parametrize("caller", UNAWARE_CALLERS, ids=[c.__name__ for c in UNAWARE_CALLERS])
@pytest.mark.parametrize("tools", [False, True], ids=["text", "tool_calls"])
def test_an_unaware_caller_gets_an_error_never_a_second_answer(
    gateway: Gateway, fakes: Fakes, kind: Kind, caller: Caller, tools: bool
) -> None:
    _queue(kind, fakes, tools)
    seen = Seen()
    if (kind.continues_text and not tools) or tools:
        # the server went on from where it broke, or nothing was shown (the relay holds
        # tool calls until the finish) and the answer was sent again: one answer, no error
        _expected(caller(gateway, kind.profile, tools, False, seen), tools)
        assert gateway.calls()[-1]["retried"] is True
        return
    with pytest.raises((openai.APIError, litellm.exceptions.APIError)) as info:
        caller(gateway, kind.profile, tools, False, seen)
    assert "upstream_stream_broken" in str(info.value) or "broke" in str(info.value)
    # what the caller had assembled is a part of the one answer, nothing glued to it
    assert ANSWER.startswith(seen.text) and len(seen.text) < len(ANSWER)
    assert seen.discards == 0
    call = gateway.calls()[-1]
    assert call["status"] == "error" and call["error_code"] == "upstream_stream_broken"
    assert call["http_status"] == 502 and call["retried"] is False and call["attempts"] == 1


def test_litellm_cannot_see_the_discard_chunk_so_it_must_not_declare(
    gateway: Gateway, fakes: Fakes
) -> None:
    """Why the event is opt-in: LiteLLM drops the chunk and glues the two answers."""
    fakes.reset()
    KINDS[2].queue_text(fakes)
    seen = litellm_stream(gateway, "gpt", False, True, Seen())
    assert seen.text != ANSWER and seen.text.endswith(ANSWER)
    assert seen.text.startswith(ANSWER[:10])
