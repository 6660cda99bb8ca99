"""Continuing an answer that broke off, on the real pinned llama-server.

SmolLM2 with a Qwen3-style template (the generation prompt opens <think>, and a
reasoning budget closes it), so an answer has reasoning and then content. A
loopback proxy between the gateway and the server cuts the first stream after
some text, as a dropped connection does; the caller must see one well-formed
answer, and the server must evaluate only a few prompt tokens to go on.

The measurement (continuation against a full resend, both after the same cut) is
printed by ``.venv/bin/pytest -s -k measure tests/integration/test_continuation_real.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from boundedcode_gateway.providers.base import PartialAnswer
from boundedcode_gateway.providers.openai_compat.continuation import continuation_body
from tests.e2e.conftest import Gateway
from tests.fakes.common import Receive, Scope, Send, read_request
from tests.fakes.server import serve_in_thread
from tests.integration.conftest import direct_stream, server_url, start_real_gateway
from tests.integration.test_reasoning_cache import run_server

pytestmark = pytest.mark.llama_server

ASK: list[Any] = [{"role": "user", "content": "Explain step by step why the sky is blue."}]
SAMPLING = {"temperature": 0, "seed": 3, "max_tokens": 160, "reasoning_budget_tokens": 48}


def text_of(event: bytes) -> tuple[str, str]:
    """(reasoning, content) of one SSE event's first choice."""
    if not event.startswith(b"data: {"):
        return "", ""
    choices = orjson.loads(event[6:]).get("choices") or [{}]
    delta = choices[0].get("delta") or {}
    return delta.get("reasoning_content") or "", delta.get("content") or ""


class CuttingProxy:
    """Passes everything to the server; the chat stream after ``cut_after`` is set is
    dropped after that many deltas of text, and the server's connection closed."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.cut_after: int | None = None
        self.chats: list[Any] = []

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        req = await read_request(scope, receive)
        cut = None
        if req.method == "POST":
            self.chats.append(req.json())
            cut, self.cut_after = self.cut_after, None
        headers = {"content-type": req.headers.get("content-type", "application/json")}
        async with (
            httpx.AsyncClient(timeout=120) as client,
            client.stream(
                req.method, self.target + req.path, content=req.raw_body, headers=headers
            ) as resp,
        ):
            kind = resp.headers.get("content-type", "application/json").encode()
            head = [(b"content-type", kind)]
            await send({"type": "http.response.start", "status": resp.status_code, "headers": head})
            if await self._relay(resp, send, cut):
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _relay(resp: httpx.Response, send: Send, cut: int | None) -> bool:
        """Relay the body; False when it was cut (the caller then sees the connection drop)."""
        buffer, shown = b"", 0
        async for data in resp.aiter_raw():
            buffer += data
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                await send(
                    {"type": "http.response.body", "body": event + b"\n\n", "more_body": True}
                )
                shown += any(text_of(event))
                if cut is not None and shown >= cut:
                    return False
        if buffer:
            await send({"type": "http.response.body", "body": buffer, "more_body": True})
        return True


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    yield from run_server()


@pytest.fixture(scope="module")
def proxied(
    server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Gateway, CuttingProxy]]:
    proxy = CuttingProxy(server)
    running = serve_in_thread(proxy.app)
    gw = start_real_gateway(
        tmp_path_factory.mktemp("cont"),
        {"cut": {"provider": "local", "external_url": running.url}},
        managed=False,
    )
    try:
        yield gw, proxy
    finally:
        gw.stop()
        running.stop()


def read_stream(lines: Iterator[str], stop_after: int | None = None) -> dict[str, Any]:
    """Reasoning, content, finish reasons and timings of a stream (or its first deltas)."""
    got: dict[str, Any] = {
        "reasoning": "",
        "content": "",
        "finish": [],
        "ids": set(),
        "n": 0,
        "reasoning_deltas": 0,
    }
    for line in lines:
        if not line.startswith("data: {"):
            continue
        obj = orjson.loads(line[6:])
        got["ids"].add(obj.get("id"))
        got["timings"] = obj.get("timings", got.get("timings"))
        for choice in obj.get("choices") or ():
            reasoning, content = text_of(line.encode())
            got["reasoning"] += reasoning
            got["content"] += content
            got["n"] += bool(reasoning or content)
            got["reasoning_deltas"] += bool(reasoning)
            if choice.get("finish_reason"):
                got["finish"].append(choice["finish_reason"])
        if stop_after is not None and got["n"] >= stop_after:
            break
    return got


def direct(url: str, body: dict[str, Any], stop_after: int | None = None) -> dict[str, Any]:
    payload = {"messages": ASK, "stream": True, **SAMPLING, **body}
    with direct_stream("POST", url + "/v1/chat/completions", json=payload, timeout=120) as resp:
        assert resp.status_code == 200
        return read_stream(resp.iter_lines(), stop_after)


def reference(url: str) -> dict[str, Any]:
    whole = direct(url, {})
    assert whole["reasoning"] and whole["content"], "the model wrote no reasoning, or no answer"
    return whole


@pytest.mark.parametrize("where", ["reasoning", "content"])
def test_a_real_stream_cut_mid_answer_goes_on_where_it_broke(
    proxied: tuple[Gateway, CuttingProxy], server: str, where: str
) -> None:
    gw, proxy = proxied
    whole = reference(server)
    # six deltas of reasoning, or the reasoning and four deltas of content
    cut = 6 if where == "reasoning" else whole["reasoning_deltas"] + 4
    proxy.cut_after = cut
    body = {"model": "cut", "messages": ASK, "stream": True, **SAMPLING}
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        got = read_stream(resp.iter_lines())
    # one well-formed answer: reasoning, then content, one finish, one id
    assert got["finish"] in (["stop"], ["length"]) and len(got["ids"]) == 1
    assert got["reasoning"] and got["content"]
    for text in (got["reasoning"], got["content"]):
        assert "<think>" not in text and "</think>" not in text
    sent = proxy.chats[-1]
    partial = sent["messages"][-1]
    assert sent["continue_final_message"] is True and partial["role"] == "assistant"
    shown = partial.get("reasoning_content", "") if where == "reasoning" else partial["content"]
    caller_text = got["reasoning"] if where == "reasoning" else got["content"]
    # the shown part once, then what follows it (an echo would repeat it)
    assert caller_text.startswith(shown) and not caller_text[len(shown) :].startswith(shown)
    if where == "content":
        assert partial["reasoning_content"] == whole["reasoning"]
    call = gw.calls()[-1]
    assert call["status"] == "ok" and call["retried"] is True
    assert call["adjustments"]["continued_after_break"] is True
    # the partial answer was in the server's cache; past the reasoning's end marker a few
    # tokens may be evaluated again (see the measurement below)
    assert call["evaluated_tokens"] <= (8 if where == "reasoning" else 16)


def measure(url: str, sampling: dict[str, Any], cut: int) -> tuple[dict[str, Any], ...]:
    """Cut a stream after ``cut`` deltas, then resend it whole; cut it again at the same
    place, then continue it. Returns (what was shown, the resend's timings, the
    continuation's timings)."""
    shown = direct(url, sampling, stop_after=cut)  # the connection drops here
    resend = direct(url, sampling)
    again = direct(url, sampling, stop_after=cut)
    assert (again["reasoning"], again["content"]) == (shown["reasoning"], shown["content"])
    partial = PartialAnswer(shown["content"], shown["reasoning"], deltas=shown["n"])
    sent = orjson.dumps({"messages": ASK, **SAMPLING, **sampling})
    cont = direct(url, orjson.loads(continuation_body(sent, partial) or b"{}"))
    return shown, resend["timings"], cont["timings"]


@pytest.mark.parametrize("template", ["plain", "reasoning"])
def test_measure_a_continuation_against_a_full_resend(
    real: Gateway, server: str, template: str
) -> None:
    url = server_url(real, "smol") if template == "plain" else server
    # the plain template writes no reasoning: no reasoning budget for it
    sampling = {"reasoning_budget_tokens": -1} if template == "plain" else {}
    whole = direct(url, sampling)
    print(f"\n{template} template, an answer of {whole['timings']['predicted_n']} tokens:")
    for cut in (12, whole["n"] * 3 // 4):
        shown, rt, ct = measure(url, sampling, cut)
        print(
            f"  cut after {cut} deltas: a full resend evaluates {rt['prompt_n']} prompt tokens"
            f" and generates {rt['predicted_n']}; the continuation evaluates {ct['prompt_n']}"
            f" and generates {ct['predicted_n']}"
        )
        # what was shown is not generated again
        assert ct["predicted_n"] <= rt["predicted_n"] - cut + 2
        if template == "plain" or not shown["content"]:
            assert ct["prompt_n"] <= 8  # the partial answer was in the server's cache
        else:
            # the reasoning's end is tokenized anew (see docs/failures.md): what follows it
            # is evaluated again, in one batch, and still not generated again
            assert ct["prompt_n"] <= len(shown["content"])
