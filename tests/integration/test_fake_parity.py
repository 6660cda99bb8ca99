"""The fake llama-server agrees with the real one on shapes, fields, statuses and error bodies.

Each scenario runs against both, directly (not through the gateway), and compares
what a client can rely on: keys present, chunk order, status codes, error texts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Gateway
from tests.fakes.common import parse_sse
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import serve_in_thread
from tests.integration.conftest import direct_get, direct_post, server_url

HELLO = [{"role": "user", "content": "Say hello to the team."}]


@pytest.fixture(scope="module")
def fake_url() -> Iterator[str]:
    # SmolLM2 is not a reasoning model, and "tuned" has 2 slots of 512 tokens
    fake = FakeLlamaServer(
        thinking=False,
        supports_preserve_reasoning=False,
        supports_tools=False,
        n_ctx=512,
        total_slots=2,
    )
    with serve_in_thread(fake.app) as srv:
        yield srv.url


@pytest.fixture
def both(real: Gateway, fake_url: str) -> dict[str, str]:
    return {"real": server_url(real, "tuned"), "fake": fake_url}


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return direct_post(url + "/v1/chat/completions", json=body, timeout=60)


def each(both: dict[str, str], fn: Any) -> tuple[Any, Any]:
    return fn(both["real"]), fn(both["fake"])


def shape(obj: Any) -> Any:
    """Keys and value types, recursively; lists by their first item."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in sorted(obj.items())}
    if isinstance(obj, list):
        return [shape(obj[0])] if obj else []
    if isinstance(obj, bool):
        return "bool"
    if isinstance(obj, int | float):
        return "number"
    return type(obj).__name__


def test_non_stream_response(both: dict[str, str]) -> None:
    real, fake = each(both, lambda u: post(u, {"messages": HELLO, "max_tokens": 8}))
    assert real.status_code == fake.status_code == 200
    r, f = real.json(), fake.json()
    assert shape(r) == shape(f)
    assert r["object"] == f["object"] == "chat.completion"
    assert r["choices"][0]["finish_reason"] in ("stop", "length")
    assert real.headers["server"] == fake.headers["server"] == "llama.cpp"


def _kinds(events: list[Any]) -> list[str]:
    kinds = []
    for e in events:
        if e == "[DONE]":
            kinds.append("done")
        elif "prompt_progress" in e:
            kinds.append("progress")
        elif not e["choices"]:
            kinds.append("usage")
        elif e["choices"][0]["finish_reason"]:
            kinds.append("finish")
        elif e["choices"][0]["delta"].get("role"):
            kinds.append("role")
        else:
            kinds.append("content")
    return kinds


def _expected_kinds(events: list[Any], progress: bool) -> list[str]:
    """The role comes with the first generated token, unless that token is held back as an
    incomplete UTF-8 sequence (an answer opening with an emoji): then only the progress
    chunks carry it."""
    kinds = ["progress"] if progress else []
    first = next((e for e in events if isinstance(e, dict) and _kinds([e]) == ["content"]), None)
    delta = first["choices"][0]["delta"] if first else {}
    text = delta.get("reasoning_content") or delta.get("content") or ""
    if len(text[:1].encode()) < 4:
        kinds.append("role")
    return [*kinds, "content", "finish", "usage", "done"]


def _collapse(kinds: list[str]) -> list[str]:
    return [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]


@pytest.mark.parametrize("progress", [False, True])
def test_stream_order_and_fields(both: dict[str, str], progress: bool) -> None:
    body = {
        "messages": HELLO,
        "max_tokens": 8,
        "stream": True,
        "return_progress": progress,
        "stream_options": {"include_usage": True},
    }
    real, fake = each(both, lambda u: post(u, body))
    assert real.status_code == fake.status_code == 200
    assert real.headers["content-type"].startswith("text/event-stream")
    assert fake.headers["content-type"].startswith("text/event-stream")
    r_events, f_events = parse_sse(real.content), parse_sse(fake.content)
    for events in (r_events, f_events):
        assert _collapse(_kinds(events)) == _expected_kinds(events, progress)
    for events in (r_events, f_events):
        objs = [e for e in events if isinstance(e, dict)]
        # llama-server stamps "created" per chunk, so a slow stream spans seconds
        assert len({(e["id"], e["model"]) for e in objs}) == 1
        assert [e["created"] for e in objs] == sorted(e["created"] for e in objs)
        assert "timings" in objs[-1] and not any("timings" in e for e in objs[:-1])
        assert all(e["object"] == "chat.completion.chunk" for e in objs)
    kinds = set(_kinds(r_events)) & set(_kinds(f_events))
    for kind in sorted(kinds - {"done"}):
        r = next(e for e, k in zip(r_events, _kinds(r_events), strict=True) if k == kind)
        f = next(e for e, k in zip(f_events, _kinds(f_events), strict=True) if k == kind)
        assert shape(r) == shape(f), kind


def test_context_overflow_body(both: dict[str, str]) -> None:
    long = [{"role": "user", "content": "overflow " * 900}]
    for body in ({"messages": long}, {"messages": long, "stream": True}):
        real, fake = each(both, lambda u, b=body: post(u, b))
        assert real.status_code == fake.status_code == 400
        r, f = real.json()["error"], fake.json()["error"]
        assert set(r) == set(f) == {"code", "message", "type", "n_prompt_tokens", "n_ctx"}
        assert r["type"] == f["type"] == "exceed_context_size_error"
        assert r["n_ctx"] == f["n_ctx"] == 512
        pattern = (
            r"request \(\d+ tokens\) exceeds the available context size \(512 tokens\), "
            r"try increasing it"
        )
        assert re.fullmatch(pattern, r["message"]) and re.fullmatch(pattern, f["message"])
        assert real.headers.get("connection") == fake.headers.get("connection") == "close"


@pytest.mark.parametrize(
    ("extra", "status", "message"),
    [
        ({"tool_choice": "sometimes"}, 400, "Invalid tool_choice: sometimes"),
        (
            {"response_format": {"type": "xml"}},
            400,
            'response_format type must be one of "text" or "json_object", but got: xml',
        ),
        ({"n": 5}, 400, None),
    ],
)
def test_request_errors(
    both: dict[str, str], extra: dict[str, Any], status: int, message: str | None
) -> None:
    real, fake = each(both, lambda u: post(u, {"messages": HELLO, "max_tokens": 4, **extra}))
    assert real.status_code == fake.status_code == status
    r, f = real.json()["error"], fake.json()["error"]
    assert r["type"] == f["type"]
    if message is not None:
        assert r["message"] == f["message"] == message
    else:
        assert r["message"] == f["message"]


def test_health_props_and_unknown_path(both: dict[str, str]) -> None:
    real, fake = each(both, lambda u: direct_get(u + "/health", timeout=10))
    assert real.status_code == fake.status_code == 200 and real.json() == fake.json()
    real, fake = each(both, lambda u: direct_get(u + "/props", timeout=10))
    r, f = real.json(), fake.json()
    assert set(r["chat_template_caps"]) == set(f["chat_template_caps"])
    # the capabilities' vision, audio and video
    assert r["modalities"] == f["modalities"] == {"vision": False, "video": False, "audio": False}
    missing = {
        "default_generation_settings",
        "total_slots",
        "model_alias",
        "modalities",
        "chat_template",
        "chat_template_caps",
        "build_info",
    } - set(f)
    assert not missing
    real, fake = each(both, lambda u: direct_get(u + "/nowhere", timeout=10))
    assert real.status_code == fake.status_code == 404
    assert real.json() == fake.json()


@pytest.fixture(scope="module")
def plain_fake_url() -> Iterator[str]:
    """A fake of a model that never reasons, as SmolLM2 with its reasoning template is
    when it writes no <think>: the answer renders back as it was generated."""
    fake = FakeLlamaServer(thinking=False, supports_tools=False, n_ctx=512, total_slots=2)
    fake.empty_think_when_off = False
    with serve_in_thread(fake.app) as srv:
        yield srv.url


def test_what_the_cache_keeper_reads_and_sends(real: Gateway, plain_fake_url: str) -> None:
    """After an answer: /slots shows the prompt and generated text of the slot that served
    it, /apply-template renders the conversation, /tokenize gives pieces, and a
    /completion of the next rendering with n_predict 0 finds the whole answer cached
    (no split when the temperature is 0 and the answer is short)."""
    found: dict[str, dict[str, Any]] = {}
    both = {"real": server_url(real, "smol"), "fake": plain_fake_url}
    for name, url in both.items():
        answer = post(url, {"messages": HELLO, "max_tokens": 8, "temperature": 0}).json()
        message = answer["choices"][0]["message"]
        prompt = direct_post(url + "/apply-template", json={"messages": HELLO}).json()["prompt"]
        slots = direct_get(url + "/slots", timeout=10).json()
        [slot] = [
            s for s in slots if isinstance(s.get("prompt"), str) and s["prompt"].endswith(prompt)
        ]
        assert slot["is_processing"] is False
        assert isinstance(slot["generated"], str) and slot["generated"]
        assert (message["content"] or "")[:4] in slot["generated"]
        following = [*HELLO, {"role": "assistant", "content": message["content"]}]
        following.append({"role": "user", "content": "next"})
        rendered = direct_post(url + "/apply-template", json={"messages": following}).json()
        text = rendered["prompt"][: rendered["prompt"].index("next")]
        pieces = direct_post(url + "/tokenize", json={"content": text, "with_pieces": True}).json()
        assert all(isinstance(p["piece"], str | list) for p in pieces["tokens"])
        body = {"prompt": text, "n_predict": 0, "cache_prompt": True}
        repair = direct_post(url + "/completion", json=body, timeout=60).json()
        found[name] = {"answer": answer, "repair": repair, "slot": slot}
    for side in found.values():
        usage, repair = side["answer"]["usage"], side["repair"]
        held = usage["prompt_tokens"] + usage["completion_tokens"]
        # the same arithmetic on both: the slot held the prompt and the answer
        assert repair["timings"]["cache_n"] >= held - 8, side
        assert (
            repair["tokens_evaluated"]
            == repair["timings"]["cache_n"] + repair["timings"]["prompt_n"]
        )
    # the same timings (the rates of zero generated tokens differ: the fake gives null)
    assert set(found["real"]["repair"]["timings"]) == set(found["fake"]["repair"]["timings"])
    keys = {"tokens_evaluated", "timings", "content"}
    assert keys <= set(found["real"]["repair"]) and keys <= set(found["fake"]["repair"])


PARTIAL = [*HELLO, {"role": "assistant", "content": "Hello team, I"}]
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"messages": PARTIAL, "continue_final_message": True},
            "Cannot set both add_generation_prompt and continue_final_message to true.",
        ),
        (
            {
                "messages": [
                    *HELLO,
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                ],
                **CONTINUE,
            },
            "Cannot continue an assistant message that contains tool calls.",
        ),
    ],
)
def test_continuations_refused(both: dict[str, str], extra: dict[str, Any], message: str) -> None:
    real, fake = each(both, lambda u: post(u, {"max_tokens": 4, **extra}))
    assert real.status_code == fake.status_code == 400
    assert real.json()["error"]["message"] == fake.json()["error"]["message"] == message


@pytest.mark.parametrize("explicit", [True, False], ids=["continue_final_message", "prefill"])
def test_a_final_assistant_message_is_continued(both: dict[str, str], explicit: bool) -> None:
    body: dict[str, Any] = {"messages": PARTIAL, "max_tokens": 6, **(CONTINUE if explicit else {})}
    streamed = {**body, "stream": True}
    for url in both.values():
        whole = post(url, body).json()["choices"][0]["message"]["content"]
        assert whole.startswith("Hello team, I")  # a whole answer holds the partial text
        events = [e for e in parse_sse(post(url, streamed).content) if isinstance(e, dict)]
        text = "".join(
            e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]
        )
        # with the flag only what follows is streamed; without it the partial text first
        assert text.startswith("Hello team, I") is not explicit
