"""A shared prompt cache is an oracle: on a profile that shares it, a task that sends the
start of another task's prompt finds it cached (``cached_tokens``, and a faster answer),
so it can test guesses of what the other task's prompt says. Under
``cache_isolation: task`` a task never reads what another task's calls left in the
server (not in a slot, not in a host-memory cache, not through a slot it names itself),
while its own next turn still finds its prefix cached."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Gateway
from tests.integration.conftest import MODEL, start_real_gateway

# what task A keeps in its system prompt, long enough that the cached part is unmistakable
SECRET = "The vault code of task A is 7341-9920-5521; never say it. " * 20
# "<|im_start|>system\n": what any two of SmolLM2's conversations share
OWN_OPENING_TOKENS = 4
SERVER = {"ctx_size": 4096, "parallel": 2}
PROFILES: dict[str, Any] = {
    # one slot: each call is pinned to its conversation's slot, so the guess meets the
    # prompt it probes where both must use the same slot
    "shared": {"provider": "local", "model_path": MODEL, "server": {**SERVER, "parallel": 1}},
    "isolated": {
        "provider": "local",
        "model_path": MODEL,
        "server": SERVER,
        "cache_isolation": "task",
    },
}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gateway = start_real_gateway(tmp_path_factory.mktemp("isolation"), PROFILES)
    yield gateway
    gateway.stop()


def _ask(gw: Gateway, model: str, task: str, messages: list[Any], **extra: Any) -> dict[str, Any]:
    resp = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": model, "messages": messages, "max_tokens": 4, "temperature": 0, **extra},
        headers={"X-BoundedCode-Task": task},
        timeout=300,
    )
    assert resp.status_code == 200, resp.text
    gw.settle()
    answer: dict[str, Any] = resp.json()
    return answer


def _cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def _first_turn(guess: str = "Say ok.") -> list[Any]:
    return [{"role": "system", "content": SECRET}, {"role": "user", "content": guess}]


def test_a_shared_cache_tells_another_task_what_a_prompt_starts_with(gw: Gateway) -> None:
    first = _ask(gw, "shared", "task-a", _first_turn())
    assert _cached(first) == 0
    guess = _ask(gw, "shared", "task-b", _first_turn("What is the code?"))
    # the guessed prefix was there: nearly the whole prompt came from task A's cache
    assert _cached(guess) > guess["usage"]["prompt_tokens"] // 2


def test_under_task_isolation_no_task_reads_another_tasks_cache(gw: Gateway) -> None:
    model = "isolated"
    first = _ask(gw, model, "task-a", _first_turn())
    assert _cached(first) == 0
    # task B guesses A's prefix, and names the slot A's call ran in: nothing is cached
    b = _ask(gw, model, "task-b", _first_turn("What is the code?"), id_slot=0)
    assert _cached(b) == 0
    # task A's own next turn still starts from its cache
    reply = first["choices"][0]["message"]
    second_turn = [
        *_first_turn(),
        {"role": "assistant", "content": reply.get("content") or ""},
        {"role": "user", "content": "Thanks."},
    ]
    again = _ask(gw, model, "task-a", second_turn)
    assert _cached(again) > again["usage"]["prompt_tokens"] // 2
    # two more tasks take the two slots over from A and B, each erased first: neither
    # finds the prefix that A (and B, who sent it) left there
    for task in ("task-c", "task-d"):
        other = _ask(gw, model, task, _first_turn("Tell me the code."))
        assert _cached(other) == 0, task
    # and task B's own repeat finds its own prompt again: its slot went to task C or D in
    # between, and its own slot file (of its group alone) is restored
    b_again = _ask(gw, model, "task-b", _first_turn("What is the code?"))
    assert _cached(b_again) > b_again["usage"]["prompt_tokens"] // 2
    record = gw.calls()[-1]
    assert record["task"] == "task-b" and record["restored_tokens"], record


def test_under_task_isolation_no_slot_loads_another_tasks_prompt_from_host_memory(
    gw: Gateway,
) -> None:
    model = "isolated"
    secret = [{"role": "system", "content": SECRET.replace("A", "E")}]
    _ask(gw, model, "task-e", [*secret, {"role": "user", "content": "Say ok."}])
    # E moves on in its slot: with a host-memory cache, its first prompt would be saved there
    _ask(gw, model, "task-e", _unrelated("a story about ships"))
    # F starts in the other slot, then guesses E's prefix there: a slot that held a prompt
    # of little likeness to the new one looks in the host-memory cache for a better one
    _ask(gw, model, "task-f", _unrelated("a poem about trees"))
    guess = _ask(gw, model, "task-f", [*secret, {"role": "user", "content": "The code?"}])
    # F's own: the template's opening, which its own earlier prompt starts with too
    assert _cached(guess) <= OWN_OPENING_TOKENS


def _unrelated(topic: str) -> list[Any]:
    text = f"You write {topic}. " * 40
    return [{"role": "system", "content": text}, {"role": "user", "content": "Begin."}]


def test_under_isolation_further_choices_are_refused(gw: Gateway) -> None:
    resp = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "isolated", "messages": _first_turn(), "max_tokens": 2, "n": 2},
        headers={"X-BoundedCode-Task": "task-a"},
        timeout=60,
    )
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["param"] == "n" and error["type"] == "invalid_request_error"


def test_an_isolated_server_runs_without_a_shared_host_cache(gw: Gateway) -> None:
    managed: Any = gw.app.fleets["isolated"].managed
    proc_argv = Path(f"/proc/{managed.pid}/cmdline").read_bytes().split(b"\0")
    at = proc_argv.index(b"--cache-ram")
    assert proc_argv[at + 1] == b"0"
    slot_dir = Path(proc_argv[proc_argv.index(b"--slot-save-path") + 1].decode())
    assert slot_dir.is_dir() and slot_dir.stat().st_mode & 0o777 == 0o700
