"""A mid-conversation system message through the Messages front to the real llama-server,
whose chat template takes one system message, at the start (it raises on any other, as
most templates do): the gateway's probe finds it, folds the message into a user turn,
and the server's cache of each turn's prompt still matches the next turn's."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Gateway
from tests.integration.conftest import MODEL, TEMPLATES, start_real_gateway

STRICT = {
    "provider": "local",
    "model_path": MODEL,
    "server": {
        "ctx_size": 2048,
        "parallel": 1,
        # no repair between turns, which a call arriving at once would cut short: the
        # slot holds what the last turn evaluated, and the fold alone decides the match
        "cache_repair": False,
        "chat_template_file": str(TEMPLATES / "chatml_system_first.jinja"),
    },
}
VERSION = {"anthropic-version": "2026-10-21"}


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_real_gateway(tmp_path_factory.mktemp("strict"), {"strict": STRICT})
    yield gw
    gw.stop()


def _ask(http: httpx.Client, messages: list[Any]) -> dict[str, Any]:
    body = {"model": "strict", "max_tokens": 8, "messages": messages}
    resp = http.post("/v1/messages", json=body, headers=VERSION, timeout=120)
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def test_a_system_message_after_the_start_is_folded_and_the_cache_kept(
    strict: Gateway,
) -> None:
    with httpx.Client(base_url=strict.url) as http:
        caps = http.get("/v1/models/strict").json()["capabilities"]
        assert caps["system_messages"] == "folded"
        turn: list[Any] = [{"role": "user", "content": "Say hi."}]
        answer = _ask(http, turn)
        usages = [answer["usage"]]
        for ask in (
            [
                {"role": "system", "content": "Answer in one word."},
                {"role": "user", "content": "Again."},
            ],
            [{"role": "user", "content": "Once more."}],
        ):
            # the model's own answer back, as a client gives it
            turn = [*turn, {"role": "assistant", "content": answer["content"]}, *ask]
            answer = _ask(http, turn)
            usages.append(answer["usage"])
    calls = strict.calls()[-2:]
    assert [c["adjustments"]["system_messages_folded"] for c in calls] == [1, 1]
    # each turn's prompt begins with all of the one before (the system message that came
    # with the second changed nothing before it): read from the server's cache
    for earlier, later in itertools.pairwise(usages):
        assert later["cache_read_input_tokens"] >= (
            earlier["input_tokens"] + earlier["cache_read_input_tokens"]
        )
