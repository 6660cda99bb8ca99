"""``attempts.py``: the sends of one call until one is answered, as the retry policy allows,
against a scripted server; waits are recorded, never slept."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from boundedcode_gateway.attempts import AttemptLog, Attempts
from boundedcode_gateway.errors import GatewayError, UpstreamUnavailable
from boundedcode_gateway.policy.retry import BACKOFF_BASE_S
from boundedcode_gateway.providers.base import PreparedRequest, Upstream
from boundedcode_gateway.upstream.http import HttpClient, Timeouts, read_body
from tests.outcomes import outcomes
from tests.unit.scripted_http import ScriptedServer, completion, json_answer, openai_upstream


def _error(message: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": code}}


OK = completion("fine")


class Waits:
    """A ``sleep`` that keeps what it was asked to wait instead of waiting."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)


@pytest.fixture
async def http() -> AsyncIterator[HttpClient]:
    client = HttpClient(Timeouts(connect_s=5.0, read_s=5.0))
    yield client
    await client.close()


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    scripted = ScriptedServer()
    await scripted.start()
    yield scripted
    await scripted.stop()


def _attempts(
    url: str, upstream: Upstream, http: HttpClient, waits: Waits, log: AttemptLog
) -> Attempts:
    prepared = PreparedRequest("/v1/chat/completions", {}, b"{}")
    return Attempts(http, upstream, prepared, log, waits, root=url)


async def test_a_first_answer_is_returned_and_counted(
    server: ScriptedServer, http: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.queue(json_answer(200, OK))
    log, waits = AttemptLog(), Waits()
    attempts = _attempts(
        server.url, openai_upstream(server.url, http, monkeypatch), http, waits, log
    )
    resp = await attempts.open()
    assert resp.status == 200 and b"fine" in await read_body(resp)
    # the answer's own outcome is logged by whoever reads it
    assert log.count == 1 and outcomes(log.entries) == [] and waits.asked == []


async def test_a_resent_status_waits_as_long_as_the_upstream_asks(
    server: ScriptedServer, http: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.queue(json_answer(503, _error("busy"), {"Retry-After": "3"}), json_answer(200, OK))
    log, waits = AttemptLog(), Waits()
    attempts = _attempts(
        server.url, openai_upstream(server.url, http, monkeypatch), http, waits, log
    )
    assert (await attempts.open()).status == 200
    assert waits.asked == [3.0]
    assert log.count == 2
    assert outcomes(log.entries) == [{"status": 503, "code": "upstream_unavailable"}]
    assert len(server.seen) == 2


async def test_without_a_wish_the_wait_is_the_jittered_backoff(
    server: ScriptedServer, http: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.queue(
        json_answer(500, _error("oops")), json_answer(500, _error("oops")), json_answer(200, OK)
    )
    log, waits = AttemptLog(), Waits()
    attempts = _attempts(
        server.url, openai_upstream(server.url, http, monkeypatch), http, waits, log
    )
    assert (await attempts.open()).status == 200
    first, second = waits.asked
    assert 0.75 * BACKOFF_BASE_S <= first <= BACKOFF_BASE_S
    assert 1.5 * BACKOFF_BASE_S <= second <= 2 * BACKOFF_BASE_S
    assert [a["status"] for a in log.entries] == [500, 500]


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, _error("bad parameter")),
        (429, _error("You exceeded your current quota", "insufficient_quota")),
    ],
    ids=["4xx", "quota"],
)
async def test_a_status_never_resent_is_raised_at_once(
    server: ScriptedServer,
    http: HttpClient,
    monkeypatch: pytest.MonkeyPatch,
    status: int,
    body: dict[str, Any],
) -> None:
    server.queue(json_answer(status, body), json_answer(200, OK))
    log, waits = AttemptLog(), Waits()
    attempts = _attempts(
        server.url, openai_upstream(server.url, http, monkeypatch), http, waits, log
    )
    with pytest.raises(GatewayError) as info:
        await attempts.open()
    assert info.value.http_status == status
    assert log.count == 1 and waits.asked == [] and len(server.seen) == 1


async def test_a_wait_past_the_budget_is_not_taken_and_the_caller_gets_the_wish(
    server: ScriptedServer, http: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.queue(json_answer(429, _error("slow down"), {"Retry-After": "120"}))
    log, waits = AttemptLog(), Waits()
    attempts = _attempts(
        server.url, openai_upstream(server.url, http, monkeypatch), http, waits, log
    )
    with pytest.raises(GatewayError) as info:
        await attempts.open()
    assert info.value.http_status == 429 and info.value.headers == {"retry-after": "120"}
    assert waits.asked == [] and log.count == 1


async def test_the_profiles_budget_caps_the_sends(
    server: ScriptedServer, http: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy = json_answer(503, _error("busy"), {"Retry-After": "0"})
    server.queue(busy, busy, json_answer(200, OK))
    upstream = openai_upstream(server.url, http, monkeypatch, retry={"max_attempts": 2})
    log, waits = AttemptLog(), Waits()
    with pytest.raises(GatewayError) as info:
        await _attempts(server.url, upstream, http, waits, log).open()
    assert info.value.http_status == 503
    assert log.count == 2 and waits.asked == [0.0] and len(server.seen) == 2


async def test_a_refused_connection_is_resent_until_the_budget_ends(
    http: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    log, waits = AttemptLog(), Waits()
    with pytest.raises(UpstreamUnavailable):
        await _attempts(url, openai_upstream(url, http, monkeypatch), http, waits, log).open()
    # the default budget: four sends, three backoffs between them
    assert log.count == 4 and len(waits.asked) == 3
    assert outcomes(log.entries) == [{"status": 503, "code": "upstream_unavailable"}] * 4


async def test_another_request_of_the_call_shares_its_log_and_clock(
    server: ScriptedServer, http: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.queue(json_answer(200, OK), json_answer(429, _error("slow down"), {"Retry-After": "5"}))
    log, waits = AttemptLog(), Waits()
    upstream = openai_upstream(server.url, http, monkeypatch)
    first = _attempts(server.url, upstream, http, waits, log)
    await read_body(await first.open())
    # the call began 58 s ago: a 5 s wait would end past the 60 s budget
    first._started -= 58
    other = PreparedRequest("/v1/chat/completions", {}, b'{"other": 1}')
    with pytest.raises(GatewayError):
        await first.for_request(other).open()
    assert log.count == 2 and waits.asked == []
    assert server.seen[1].body == b'{"other": 1}'


class _MovingLease:
    """A pool's lease whose first server is down: the request moves to ``there``, whose
    key is its own."""

    def __init__(self, dead: str, there: str) -> None:
        self.dead = dead
        self.there = there

    def root(self, request_bytes: int) -> str:
        return self.dead

    async def moved_root(self) -> str | None:
        return self.there

    async def pinned(self, body: bytes) -> bytes:
        return body  # a pool that does not isolate its cache

    def headers_for(self, url: str) -> dict[str, str]:
        if url.startswith(self.dead):
            return {"Authorization": "Bearer key-of-the-dead"}
        assert url.startswith(self.there)
        return {"Authorization": "Bearer key-of-the-other-server"}


async def test_a_request_moved_to_another_server_carries_that_servers_key(
    server: ScriptedServer, http: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    server.queue(json_answer(200, OK))
    headers = {"Content-Type": "application/json", "authorization": "Bearer key-of-the-dead"}
    lease: Any = _MovingLease(dead, server.url)
    prepared = PreparedRequest("/v1/chat/completions", headers, b"{}")
    upstream = openai_upstream(server.url, http, monkeypatch)
    resp = await Attempts(http, upstream, prepared, AttemptLog(), Waits(), server=lease).open()
    assert resp.status == 200
    await read_body(resp)
    assert server.seen[0].header("Authorization") == "Bearer key-of-the-other-server"
    assert server.seen[0].head.lower().count(b"authorization") == 1
    assert prepared.headers["Content-Type"] == "application/json"
