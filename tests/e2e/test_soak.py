"""Soak: 2,000 requests at concurrency 32, over all six provider kinds, through randomly
injected faults of every kind.

Bounded in count and time, loopback only. Every fault is scripted in the shared ``Reply``
vocabulary, which each kind's fake renders in its own wire shape. Half the streaming
callers declare that they understand the discard event; no other caller ever receives two
answers in one stream. Afterwards every request has exactly one ledger row, none hung, and
the process's sockets and memory are back near where they started.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.e2e.conftest import Gateway, GatewayFactory
from tests.e2e.every_kind import Fakes, fakes
from tests.fakes.common import Reply, parse_sse

__all__ = ["fakes"]  # the module-scoped fixture

REQUESTS = 2000
CONCURRENCY = 32
DEADLINE_S = 240.0
PER_REQUEST_TIMEOUT_S = 30.0
# a silent upstream is given up after this; a busy machine's streams stay well inside it
READ_TIMEOUT_S = 5.0
# the profiles of every_kind.py, by the fake behind each, and whether it is a local server
KINDS = [
    ("local", "llama", True),
    ("other", "other", True),
    ("gpt", "openai", False),
    ("glm", "compat", False),
    ("claude", "claude", False),
    ("gem", "gemini", False),
]
MODELS = [profile for profile, _, _ in KINDS]
LLAMA_500 = {
    "error": {
        "code": 500,
        "type": "server_error",
        "message": "Failed to parse tool call arguments as JSON: x",
    }
}


TEXT = "alpha beta gamma delta epsilon zeta eta theta"
AWARE = {"X-BoundedCode-Stream-Discard": "1"}


def check_one_answer(raw: bytes, aware: bool) -> int:
    """The stream holds one answer — after the last discard event, for an aware caller;
    returns how many discard events it held."""
    events = [e for e in parse_sse(raw) if isinstance(e, dict)]
    discards = [i for i, e in enumerate(events) if "boundedcode" in e]
    assert aware or not discards, "a discard event for a caller that did not ask for it"
    answer = events[discards[-1] + 1 :] if discards else events
    deltas = [e["choices"][0] for e in answer if e.get("choices")]
    text = "".join(d["delta"].get("content") or "" for d in deltas)
    assert TEXT.startswith(text), f"not one answer: {text!r}"
    assert len([d for d in deltas if d.get("finish_reason")]) <= 1
    heads = Counter(
        call["index"]
        for d in deltas
        for call in d["delta"].get("tool_calls") or ()
        if call.get("id") is not None
    )
    assert all(n == 1 for n in heads.values()), heads
    return len(discards)


def faulty_replies(rng: random.Random, n: int, local: bool) -> list[Reply]:
    """Replies with every fault the gateway handles, mixed with good ones; now and then a
    silence the read timeout ends."""
    text = TEXT
    faults = [
        lambda: Reply(content=text),
        lambda: Reply(content=text, break_after_chunks=rng.randint(0, 6), cut_body=True),
        lambda: Reply(
            content=text,
            error_event_after_chunks=rng.randint(0, 6),
            error_event_status=rng.choice([400, 500]),
        ),
        lambda: Reply(content=text, delay_ms=rng.randint(0, 30)),
        lambda: Reply(content="", tool_calls=[{"name": "read", "arguments": '{"p": 1}'}]),
    ]
    if local:
        faults.append(lambda: Reply(status=500, error_body=LLAMA_500))
    else:
        faults += [
            lambda: Reply(status=429, headers={"retry-after": "0"}),
            lambda: Reply(status=529, headers={"retry-after": "0"}),
            lambda: Reply(status=503, headers={"retry-after-ms": "5"}),
        ]
    silences = [
        lambda: Reply(content=text, silent_after_chunks=rng.randint(0, 6)),
        lambda: Reply(content=text, silent_before_headers=True),
    ]
    return [rng.choice(silences if rng.random() < 0.005 else faults)() for _ in range(n)]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


async def one_request(
    session: aiohttp.ClientSession,
    url: str,
    rng: random.Random,
    models: Sequence[str] = MODELS,
    headers: Mapping[str, str] | None = None,
) -> str:
    """One request of the soak, to one of ``models``, with ``headers`` added; its outcome."""
    model = rng.choice(models)
    stream = rng.random() < 0.6
    words = 6000 if rng.random() < 0.03 else 8  # now and then, longer than the context
    body = {
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": "hi " * words}],
    }
    hang_up = stream and rng.random() < 0.05
    aware = stream and rng.random() < 0.5
    sent = {"content-type": "application/json", **(AWARE if aware else {}), **(headers or {})}
    async with session.post(url, data=orjson.dumps(body), headers=sent) as resp:
        if hang_up:
            await resp.content.readany()
            resp.close()
            return "hung_up"
        raw = await resp.read()
    if resp.status != 200:
        error = orjson.loads(raw)["error"]
        return f"http_{resp.status}_{error['code']}"
    if not stream:
        assert orjson.loads(raw)["choices"]
        return "ok"
    discards = check_one_answer(raw, aware)
    if raw.endswith(b"data: [DONE]\n\n"):
        return "ok_after_discard" if discards else "ok"
    last = raw.rstrip().rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b'data: {"error"'), raw[-300:]
    return "in_stream_error"


async def load(url: str, seed: int, n: int) -> Counter[str]:
    rng = random.Random(seed)
    sem = asyncio.Semaphore(CONCURRENCY)
    outcomes: Counter[str] = Counter()
    timeout = aiohttp.ClientTimeout(total=PER_REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def run() -> None:
            async with sem:
                try:
                    outcomes[await one_request(session, url, rng)] += 1
                except TimeoutError:
                    outcomes["hung"] += 1

        await asyncio.wait_for(asyncio.gather(*(run() for _ in range(n))), DEADLINE_S)
    return outcomes


# Thousands of sockets close here, some from threads the collector reaches late; a leak is
# caught by counting descriptors below, not by which object the collector warns about.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_soak(fakes: Fakes, start_gateway: GatewayFactory) -> None:
    rng = random.Random(20261129)
    fakes.reset()
    for _, attr, local in KINDS:
        getattr(fakes, attr).queue(*faulty_replies(rng, REQUESTS, local))
    profiles = {
        **fakes.profiles,
        # the cache keeper's follow-ups have their own tests (test_cache_keeper.py)
        "local": {**fakes.profiles["local"], "server": {"cache_repair": False}},
    }
    gw: Gateway = start_gateway(profiles, inference={"read_timeout_s": READ_TIMEOUT_S})
    url = gw.url + "/v1/chat/completions"
    asyncio.run(load(url, seed=1, n=100))  # warm-up: pools, caches, first imports
    time.sleep(5.5)  # idle connections expire (4 s in the gateway's pool, 5 s at the fakes)
    fds_before, rss_before = open_fds(), rss_mib()
    rows_before = len(gw.ledger_rows())

    started = time.monotonic()
    outcomes = asyncio.run(load(url, seed=2, n=REQUESTS))
    elapsed = time.monotonic() - started

    assert sum(outcomes.values()) == REQUESTS
    assert outcomes["hung"] == 0, outcomes
    assert outcomes["ok"] + outcomes["ok_after_discard"] > REQUESTS // 2, outcomes
    assert outcomes["ok_after_discard"] > 0, outcomes
    # a caller that hung up is recorded when the gateway's side of its call has ended,
    # which may be just after the caller gave up
    deadline = time.monotonic() + 10
    while len(gw.ledger_rows()) < rows_before + REQUESTS and time.monotonic() < deadline:
        time.sleep(0.05)
    rows = gw.ledger_rows()[rows_before:]
    calls = gw.calls()[rows_before:]
    # exactly one row per request, whatever happened to it
    assert len(rows) == len(calls) == REQUESTS
    assert len({r["call_id"] for r in rows}) == REQUESTS
    statuses = Counter(r["http_status"] for r in rows)
    # a caller that hangs up after a short answer was fully sent is an ok call
    assert statuses[499] <= outcomes["hung_up"]
    assert set(statuses) <= {200, 400, 429, 499, 500, 502, 503, 504, 529}, statuses
    # every kind was called, and every kind's faults reached the gateway
    assert {r["model_profile"] for r in rows} == {profile for profile, _, _ in KINDS}
    time.sleep(5.5)
    assert open_fds() <= fds_before + 8
    assert rss_mib() < rss_before + 64
    print(f"\nsoak: {REQUESTS} requests in {elapsed:.1f} s; outcomes {dict(outcomes)}")
    gc.collect()  # inside this test's warning filters, not the next test's
