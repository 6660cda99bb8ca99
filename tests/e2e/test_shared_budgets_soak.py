"""Soak of the budgets several gateways share (docs/budgets.md, "When calls are checked and
counted"; budgets/shared.py): three gateways on one PostgreSQL ledger, 48 callers at once on
one key with a daily ``max_tokens`` budget, each sending six calls capped by ``max_tokens``
in turn to the three gateways, through chat completions or (one caller in four) the Messages
front. Mid-run the third gateway, a ``serve`` process of its own, is killed (SIGKILL) with
calls in flight and started again with the same configuration; then the database is cut
off from all three for a few seconds, and the callers go on once it is back.

Bounded in count and time, loopback only, seeded. Unchecked, the calls would spend some 2.6
times the limit. With a hard cap on every call the bound is 0, asserted from the database:
the ledger's spending never passes the limit, nor does it with what the calls in flight
hold, sampled as the run goes and at its end (where the killed gateway's reservations
still count, until they expire). Every answer is one row of its front and status, no call
is written twice, and the calls the kill cut off are accounted for (a row without an
answer, a reservation left behind, or neither); the budgets' sums are the ledger's, each
row counted once. A budget's refusal is a 429 in its front's shape with ``x-should-retry:
false`` and ``Retry-After`` to the next UTC midnight; a call while the database is away is
refused with 503 ``budget_store_unavailable`` (the Messages front: Anthropic's 529
``overloaded_error``) and ``Retry-After: 1``; a call goes unanswered only on the killed
gateway, while it was down or in flight when it died. After the run every gateway, the
restarted one included, refuses a call that does not fit, with the ledger's count and what
the killed one still holds in its words.

The key has a rate limit too, of requests per minute, that the three gateways count in
one window of the database: fewer than the run's calls, more than any one gateway takes,
so only a shared count refuses calls, and it does once the database is back. A call over
it is refused in its front's words, with ``Retry-After`` from the window; the window never
counts past the limit; and every gateway, the restarted one too, reads the same window
and the same budget from the database afterwards.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import asyncpg
import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

import boundedcode_gateway
from boundedcode_gateway.budgets.shared import SharedBudgets
from boundedcode_gateway.operations.metrics import PREFIX
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.e2e.test_budgets import key, start
from tests.e2e.test_cli import free_port
from tests.fakes.common import Reply
from tests.fakes.tcp_proxy import TcpProxy
from tests.postgres_db import SERVER_PORT, PgDatabase

CALLER = "ci"
ADMIN = "ops"  # reads the serve process's /metrics
CALLERS = 48
# each caller's calls: FREE_CALLS as it goes (the gateway is killed among them), one while
# the database is cut off, the rest once it is back
CALLS_EACH = 6
FREE_CALLS = 3
MAX_TOKENS = 4000
# A call reserves its bytes, the template's 1,024 and its cap (some 5,100 tokens) and
# spends some 4,030: 288 calls would spend some 1,160,000 unchecked, 2.6 times the limit.
# The first calls fit, then fewer and fewer, until nothing fits any more.
LIMIT = 450_000
# the key's requests per minute: the calls counted, those the database answered (some
# 200 of the 288), pass it together; one gateway's share of them (some 70) never does
RATE_LIMIT = 150
RATE_WINDOW_S = 60
# each answer as long as its cap allows, and slow enough that calls overlap and some are
# in flight when the gateway is killed
ANSWER = Reply(content="word " * 2500, delay_ms=800)
# every fourth caller speaks Anthropic's Messages API, the others chat completions
MESSAGES_EVERY = 4
ANTHROPIC_VERSION = "2023-06-01"
# gateway 2 is the serve process that is killed and started again
KILLED = 2
SEED = 20261206
# a caller waits this long (uniform, seconds) before its first call and between two
FIRST_WAIT_S = (0.0, 0.5)
GAP_S = (0.3, 1.5)
# after the cut began, before its call while the database is away
DURING_CUT_S = (0.3, 1.5)
# after the restore, before its next call: all at once, the database's pools back
AFTER_RESTORE_S = (1.5, 1.7)
# the kill: once this far into the run, and the process holds a reservation
KILL_AFTER_S = 1.5
# how long the killed gateway stays down before it is started again
DOWN_S = 1.0
# the cut: no sooner than this far into the run (and after the restart), this long
CUT_AFTER_S = 4.0
CUT_S = 3.0
PER_CALL_TIMEOUT_S = 30.0
# the whole run; pytest-timeout's 120 s per test is well above it
DEADLINE_S = 60.0
START_S = 30.0
SETTLE_S = 30.0
WATCH_EVERY_S = 0.02

# What the caller spent today, and what the calls in flight of every gateway hold of its
# budget, as the reservations see it: one statement, one snapshot.
HELD_SQL = """
SELECT (SELECT COALESCE(SUM(tokens), 0) FROM budget_spent
        WHERE kind = 'caller' AND name = $1
          AND day = to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD')) AS spent,
       (SELECT COALESCE(SUM(tokens), 0) FROM budget_reservations
        WHERE kind = 'caller' AND name = $1 AND expires_at > now()) AS held
"""
SPENT_WORDS = re.compile(
    rf"caller '{CALLER}' has spent ([\d,]+) tokens of its max_tokens budget of "
    rf"{LIMIT:,} tokens per UTC day(?:, ([\d,]+) tokens held by calls in flight)?;"
)


@dataclass(frozen=True)
class Outcome:
    """One call as its caller saw it: an answer (its status), or the transport's error."""

    caller: int
    gateway: int
    front: str  # "chat" or "messages"
    started: float
    ended: float
    status: int | None = None
    error: str | None = None  # the class of the transport's error, when no answer came
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None


@dataclass
class Timeline:
    """When (monotonic seconds) the run began, and the kill, the restart and the cut
    happened."""

    began: float
    kill: float = float("inf")  # the SIGKILL sent
    dead: float = float("inf")  # the process gone
    ready: float = float("inf")  # the new process answering
    cut: float = float("inf")  # the cut asked for
    cut_done: float = float("inf")  # every connection reset, new ones refused
    restoring: float = float("inf")  # the restore asked for
    restored: float = float("inf")  # the proxy listening again


class ServeProcess:
    """``boundedcode-gateway serve`` in a process of its own, that a test can kill."""

    def __init__(self, config: Path, port: int, log: Path) -> None:
        self.config = config
        self.port = port
        self.log = log
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    def start(self) -> None:
        """Start it and return once it answers /health."""
        # the code under test, also where the package is installed from another checkout
        src = str(Path(boundedcode_gateway.__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": src}
        self._out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "boundedcode_gateway",
                "serve",
                "--config",
                str(self.config),
                "--port",
                str(self.port),
            ],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"serve exited:\n{self.output()}"
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"serve did not start:\n{self.output()}")

    def kill(self) -> None:
        """SIGKILL: no graceful path, nothing written after it."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._close_output()

    def stop(self) -> None:
        """SIGTERM, as an operator stops it; SIGKILL should it linger."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._close_output()

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def _close_output(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


class Watcher(threading.Thread):
    """Samples what was spent and what is held of the caller's budget, on one connection
    of its own (straight to the server, never cut), until told to stop."""

    def __init__(self, url: str) -> None:
        super().__init__(name="budget-watcher")
        self.url = url
        self.samples: list[int] = []
        self.failure: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._watch())
        except BaseException as exc:
            self.failure = exc

    async def _watch(self) -> None:
        conn = await asyncpg.connect(self.url, timeout=5)
        try:
            deadline = time.monotonic() + DEADLINE_S + SETTLE_S
            while not self.done.is_set() and time.monotonic() < deadline:
                row = await conn.fetchrow(HELD_SQL, CALLER)
                assert row is not None
                self.samples.append(int(row["spent"]) + int(row["held"]))
                await asyncio.sleep(WATCH_EVERY_S)
        finally:
            await conn.close()


def ask(client: httpx.Client, url: str, front: str, text: str, max_tokens: int) -> httpx.Response:
    """One call of the caller's key, capped by ``max_tokens``, through ``front``."""
    messages = [{"role": "user", "content": text}]
    body = {"model": "gpt", "max_tokens": max_tokens, "messages": messages}
    if front == "messages":
        headers = {"x-api-key": CALLER, "anthropic-version": ANTHROPIC_VERSION}
        return client.post(url + "/v1/messages", json=body, headers=headers)
    headers = {"Authorization": f"Bearer {CALLER}"}
    return client.post(url + "/v1/chat/completions", json=body, headers=headers)


def call_tokens(outcome: Outcome) -> int:
    """What an answered call spent, from the usage its answer reports."""
    usage = outcome.body["usage"]
    if outcome.front == "messages":
        prompt = (
            usage["input_tokens"]
            + (usage.get("cache_creation_input_tokens") or 0)
            + (usage.get("cache_read_input_tokens") or 0)
        )
        return int(prompt + usage["output_tokens"])
    return int(usage["prompt_tokens"] + usage["completion_tokens"])


def ledger_status(outcome: Outcome) -> int:
    """The status the ledger records for an answer: the gateway's own (the Messages front
    answers its 503 as Anthropic's 529)."""
    assert outcome.status is not None
    return 503 if outcome.status == 529 else outcome.status


def over_rate(outcome: Outcome) -> bool:
    """Whether a call was refused by the key's rate limit (not by its budget)."""
    return outcome.status == 429 and outcome.body["error"]["message"].startswith(
        "Rate limit exceeded: "
    )


def check_rate_refusal(outcome: Outcome) -> None:
    """A refusal by the key's rate limit in its front's shape, with the wait the window
    gives."""
    body, headers = outcome.body, outcome.headers
    detail = f"{outcome.front} {outcome.status} {body}"
    error = body["error"]
    assert f"caller '{CALLER}' is over its requests limit" in error["message"], detail
    if outcome.front == "messages":
        assert body["request_id"] == headers["request-id"], detail
        assert error["type"] == "rate_limit_error", detail
    else:
        assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests"), detail
    # the window's own wait: it may be sent again then
    assert 1 <= int(headers["retry-after"]) <= 2 * RATE_WINDOW_S, detail
    assert headers.get("x-should-retry") != "false", detail


def check_refusal(outcome: Outcome) -> None:
    """A refusal in its front's shape, with the headers that tell a client what to do."""
    if over_rate(outcome):
        check_rate_refusal(outcome)
        return
    status, body, headers = outcome.status, outcome.body, outcome.headers
    detail = f"{outcome.front} {status} {body}"
    if outcome.front == "messages":
        assert body["type"] == "error" and body["request_id"] == headers["request-id"], detail
        error = body["error"]
        if status == 429:
            assert error["type"] == "rate_limit_error", detail
            assert error["message"].startswith("Budget exceeded: "), detail
        else:
            assert (status, error["type"]) == (529, "overloaded_error"), detail
            assert error["message"].startswith("The budgets' database is not answering"), detail
    else:
        error = body["error"]
        if status == 429:
            assert (error["code"], error["type"]) == ("budget_exceeded", "insufficient_quota")
            assert error["message"].startswith("Budget exceeded: "), detail
        else:
            assert status == 503, detail
            assert (error["code"], error["type"]) == ("budget_store_unavailable", "server_error")
    if status == 429:
        # final: no client should send it again before the day renews, at the next midnight
        assert headers["x-should-retry"] == "false", detail
        assert 1 <= int(headers["retry-after"]) <= 86_400, detail
    else:
        assert headers["retry-after"] == "1", detail


def waiting(url: str) -> float:
    """The records a serve process has not written to its ledger yet (its /metrics)."""
    body = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5)
    assert body.status_code == 200, body.text
    names = {f"{PREFIX}_metering_queue_depth", f"{PREFIX}_metering_ledger_buffered_records"}
    return sum(
        sample.value
        for family in text_string_to_metric_families(body.text)
        for sample in family.samples
        if sample.name in names
    )


def wait_for(what: str, done: Any, timeout_s: float = SETTLE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Soak:
    """The callers: each sends ``CALLS_EACH`` calls in turn, to the three gateways in turn:
    ``FREE_CALLS`` as it goes (the kill comes among them), one while the database is cut
    off, the others once it is back; and what each call got."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.timeline = Timeline(time.monotonic())
        self.deadline = self.timeline.began + DEADLINE_S
        self.outcomes: list[Outcome] = []
        # one TLS context for every caller's client (none is used: the URLs are plain)
        self.tls = ssl.create_default_context()
        self.cutting = threading.Event()
        self.restored = threading.Event()
        self._lock = threading.Lock()

    def caller(self, n: int) -> None:
        rng = random.Random(SEED + n)
        front = "messages" if n % MESSAGES_EVERY == MESSAGES_EVERY - 1 else "chat"
        # no keep-alive: each call a connection of its own, as a killed gateway's callers
        # meet it (refused while it is down, cut off while in flight)
        limits = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(timeout=PER_CALL_TIMEOUT_S, limits=limits, verify=self.tls) as client:
            for m in range(CALLS_EACH):
                self.wait_for_turn(m, rng)
                if time.monotonic() > self.deadline:
                    return
                done = self.call(client, n, m, front)
                with self._lock:
                    self.outcomes.append(done)

    def wait_for_turn(self, m: int, rng: random.Random) -> None:
        """Wait before call ``m``: as the caller goes, for the cut, for the restore."""
        if m == FREE_CALLS:
            self.cutting.wait(max(0.0, self.deadline - time.monotonic()))
            time.sleep(rng.uniform(*DURING_CUT_S))
        elif m == FREE_CALLS + 1:
            self.restored.wait(max(0.0, self.deadline - time.monotonic()))
            time.sleep(rng.uniform(*AFTER_RESTORE_S))
        else:
            time.sleep(rng.uniform(*(GAP_S if m else FIRST_WAIT_S)))

    def call(self, client: httpx.Client, n: int, m: int, front: str) -> Outcome:
        gateway = (n + m) % len(self.urls)
        started = time.monotonic()
        try:
            resp = ask(client, self.urls[gateway], front, f"caller {n}, call {m}", MAX_TOKENS)
        except httpx.TransportError as exc:
            return Outcome(n, gateway, front, started, time.monotonic(), error=type(exc).__name__)
        return Outcome(
            n, gateway, front, started, time.monotonic(), resp.status_code,
            headers=dict(resp.headers), body=resp.json(),
        )  # fmt: skip

    def disrupt(
        self, pg: PgDatabase, process: ServeProcess, proxy: TcpProxy, known: set[str]
    ) -> list[dict[str, Any]]:
        """Kill the serve process with a call in flight and start it again, then cut the
        database off for ``CUT_S``; what the killed process held when it died."""
        timeline = self.timeline
        time.sleep(KILL_AFTER_S)
        wait_for("a call in flight on the gateway to kill", lambda: bool(held_by(pg, known)))
        timeline.kill = time.monotonic()
        process.kill()
        timeline.dead = time.monotonic()
        time.sleep(DOWN_S)
        # nobody renews these now, nor writes their calls' rows: they count until they expire
        left_behind = held_by(pg, known)
        assert len(left_behind) <= 1, left_behind
        process.start()
        timeline.ready = time.monotonic()
        time.sleep(max(0.0, timeline.began + CUT_AFTER_S - time.monotonic()))
        timeline.cut = time.monotonic()
        proxy.cut()
        timeline.cut_done = time.monotonic()
        self.cutting.set()
        time.sleep(CUT_S)
        timeline.restoring = time.monotonic()
        proxy.restore()
        timeline.restored = time.monotonic()
        self.restored.set()
        return next(iter(left_behind.values()), [])


def held_by(pg: PgDatabase, known: set[str]) -> dict[str, list[dict[str, Any]]]:
    """The reservations of the gateways other than ``known``, by gateway."""
    found: dict[str, list[dict[str, Any]]] = {}
    for row in pg.fetch("SELECT call_id, gateway, tokens FROM budget_reservations"):
        if row["gateway"] not in known:
            found.setdefault(row["gateway"], []).append(row)
    return found


def check_answers(soak: Soak) -> list[Outcome]:
    """What the callers saw: each answer a status its front gives, each refusal in its
    front's shape; no answer only from the killed gateway, while it was down or cut off
    in flight by the kill. The calls cut off."""
    timeline, outcomes = soak.timeline, soak.outcomes
    assert len(outcomes) == CALLERS * CALLS_EACH
    answered = [o for o in outcomes if o.status is not None]
    statuses = Counter((o.front, o.status) for o in answered)
    assert {s for f, s in statuses if f == "chat"} <= {200, 429, 503}, statuses
    assert {s for f, s in statuses if f == "messages"} <= {200, 429, 529}, statuses
    for front in ("chat", "messages"):
        assert statuses[front, 200] and statuses[front, 429], statuses
    for o in answered:
        if o.status != 200:
            check_refusal(o)
    # calls were refused for not fitting whole while something was left
    words = [o.body["error"]["message"] for o in answered if o.status == 429]
    assert any("this call may spend up to" in w for w in words)
    # and by the rate limit the three gateways counted together, once the free calls and
    # those after the cut passed it
    assert any(over_rate(o) for o in answered), statuses
    # the database's refusals came with the cut (and the tries that followed it)
    away = [o for o in answered if ledger_status(o) == 503]
    assert all(o.ended >= timeline.cut for o in away), (timeline, away[:3])
    # and every call made while it was away was refused so, by every gateway
    during = [
        o for o in outcomes if timeline.cut_done <= o.started and o.ended <= timeline.restoring
    ]
    assert {(o.front, o.status) for o in during} == {("chat", 503), ("messages", 529)}, during
    assert {o.gateway for o in during} == {0, 1, 2} and len(during) >= CALLERS // 2
    # the restarted gateway answered, after the database came back too
    assert any(o.gateway == KILLED and o.started > timeline.restored for o in answered)
    unanswered = [o for o in outcomes if o.status is None]
    assert all(o.gateway == KILLED for o in unanswered), unanswered
    refused = [o for o in unanswered if o.error == "ConnectError"]
    cut_off = [o for o in unanswered if o.error != "ConnectError"]
    for o in refused:
        assert timeline.kill <= o.ended and o.started <= timeline.ready, (timeline, o)
    for o in cut_off:
        assert o.started <= timeline.dead and timeline.kill <= o.ended, (timeline, o)
    assert cut_off, "no call was in flight when the gateway was killed"
    return cut_off


def check_ledger(
    pg: PgDatabase,
    upstreams: Upstreams,
    soak: Soak,
    dead: list[dict[str, Any]],
    cut_off: list[Outcome],
) -> tuple[int, int]:
    """Every answer one row, none twice, and the rows the calls cut off may have; the
    budgets' sums the ledger's, never past the limit with what is still held. What was
    spent today, and what the killed process still holds."""
    rows = pg.fetch(
        "SELECT call_id, front, http_status, status,"
        " COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0) AS tokens,"
        " substr(started_at, 1, 10) AS day"
        " FROM model_calls WHERE caller = $1",
        CALLER,
    )
    ids = {r["call_id"] for r in rows}
    assert len(ids) == len(rows), "a call was written twice"
    answered = [o for o in soak.outcomes if o.status is not None]
    # each answer is one row of its front and status; a call the kill cut off may have a
    # row without an answer (its record was written before the process died), or none
    in_ledger = Counter((r["front"], r["http_status"]) for r in rows)
    told = Counter((o.front, ledger_status(o)) for o in answered)
    assert not told - in_ledger, (told, in_ledger)
    unanswered = in_ledger - told
    assert {status for _, status in unanswered} <= {200, 429}, unanswered
    # and what the answers say they spent is what their rows hold
    served = [o for o in answered if o.status == 200]
    ok_rows = [r for r in rows if r["status"] == "ok"]
    extra = len(ok_rows) - len(served)
    most = max(call_tokens(o) for o in served)
    over = sum(r["tokens"] for r in ok_rows) - sum(call_tokens(o) for o in served)
    assert 0 <= over <= extra * most, (over, extra)
    assert all(r["tokens"] == 0 for r in rows if r["status"] != "ok")
    # each row reached the upstream once; a call cut off may have reached it without one
    sent = [r for r in upstreams.openai.requests if r.path.endswith("/chat/completions")]
    assert len(ok_rows) <= len(sent) <= len(ok_rows) + len(cut_off)
    # the workload would have spent 2-3 times the limit, unchecked
    assert 2 * LIMIT <= CALLERS * CALLS_EACH * most <= 3 * LIMIT

    # the budgets counted each row once: their sums are the ledger's, by day and in all
    by_day: Counter[str] = Counter()
    for r in rows:
        by_day[r["day"]] += r["tokens"]
    counted = pg.fetch(
        "SELECT day, tokens FROM budget_spent WHERE kind = 'caller' AND name = $1", CALLER
    )
    assert {c["day"]: c["tokens"] for c in counted} == {"": by_day.total(), **by_day}
    assert all(tokens <= LIMIT for tokens in by_day.values()), by_day
    # only the killed process's calls are held still, none of them in the ledger, each a
    # call the kill cut off (one with a row let its reservation go)
    held = pg.fetch("SELECT call_id, tokens FROM budget_reservations")
    assert {r["call_id"] for r in held} == {r["call_id"] for r in dead}
    assert not {r["call_id"] for r in held} & ids
    assert unanswered.total() + len(held) <= len(cut_off), (unanswered, held, cut_off)
    holding = sum(r["tokens"] for r in held)
    today = str(pg.fetch("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS d")[0]["d"])
    assert by_day[today] + holding <= LIMIT, (by_day, holding)
    # the shared window never counted past the key's limit in either of its minutes
    (window,) = pg.fetch(
        "SELECT current, previous FROM rate_windows WHERE (kind, name, metric) = "
        "('caller', $1, 'requests')",
        CALLER,
    )
    assert 0 < window["current"] <= RATE_LIMIT and window["previous"] <= RATE_LIMIT, window
    return by_day[today], holding


def check_counts(urls: list[str], restarted: str, spent: int, holding: int) -> None:
    """Every gateway, the restarted one too, reads the same budget and window from the
    database: what the ledger holds, what the killed process still holds, the requests
    counted; and refuses a call that does not fit (or, over the rate limit too, a call
    over that), on both fronts, in its words."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    used: list[float] = []
    with httpx.Client(timeout=PER_CALL_TIMEOUT_S) as client:
        for url in urls:
            seen = client.get(url + "/ui/api/limits", headers=admin).json()
            (budget,) = [b for b in seen["budgets"] if b["name"] == CALLER]
            assert (budget["spent"], budget["held"]) == (spent, holding), (url, budget)
            (window,) = [w for w in seen["windows"] if w["name"] == CALLER]
            used.append(window["used"])
        # the same window, read a moment apart as its previous minute's weight falls
        assert min(used) > 0 and max(used) - min(used) < 2, used
        for url, front in [*((u, "chat") for u in urls), (restarted, "messages")]:
            resp = ask(client, url, front, "one more", LIMIT)
            assert resp.status_code == 429, resp.text[:500]
            if resp.json()["error"]["message"].startswith("Rate limit exceeded: "):
                # both refuse it: the window's answer came first
                headers = dict(resp.headers)
                check_rate_refusal(Outcome(0, 0, front, 0, 0, 429, None, headers, resp.json()))
                continue
            message = resp.json()["error"]["message"]
            found = SPENT_WORDS.search(message)
            assert found is not None, message
            assert int(found[1].replace(",", "")) == spent, message
            assert int((found[2] or "0").replace(",", "")) == holding, message


def test_three_gateways_keep_a_shared_budget_through_a_kill_and_a_database_cut(
    pg: PgDatabase, upstreams: Upstreams, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    proxy = TcpProxy(target_port=SERVER_PORT).start()
    in_process: list[Gateway] = []
    process: ServeProcess | None = None
    try:
        caller = {
            **key(CALLER, {"max_tokens": LIMIT, "per": "day"}),
            "rate_limits": {"requests": {"limit": RATE_LIMIT, "window_s": RATE_WINDOW_S}},
        }
        keys = [caller, {**key(ADMIN), "admin": True}]
        # every gateway reaches the database through the proxy; each answer waits for its
        # record (metering.sync), but not for a database that is away
        settings: dict[str, Any] = {"ledger": pg.url_at(proxy.port), "metering": {"sync": True}}
        in_process = [start(start_gateway, upstreams, keys, **settings) for _ in range(2)]
        known = set()
        for gw in in_process:
            assert isinstance(gw.app.budgets, SharedBudgets)
            known.add(gw.app.budgets.gateway)
        # the third, with the same settings, in a process of its own that can be killed
        config = tmp_path / "killed.yaml"
        whole = {"data_dir": str(tmp_path / "killed"), "auth": {"keys": keys}, **settings}
        config.write_text(yaml.safe_dump({**whole, "models": {"gpt": upstreams.profiles["gpt"]}}))
        process = ServeProcess(config, free_port(), tmp_path / "serve.log")
        process.start()
        upstreams.openai.queue(*[ANSWER for _ in range(CALLERS * CALLS_EACH)])

        soak = Soak([gw.url for gw in in_process] + [process.url])
        watcher = Watcher(pg.url)
        watcher.start()
        threads = [threading.Thread(target=soak.caller, args=(n,)) for n in range(CALLERS)]
        try:
            for t in threads:
                t.start()
            dead = soak.disrupt(pg, process, proxy, known)
        finally:
            soak.cutting.set()
            soak.restored.set()
            for t in threads:
                t.join(max(1.0, soak.deadline - time.monotonic()))
            watcher.done.set()
            watcher.join(10)
        assert not any(t.is_alive() for t in threads), "callers still running at the deadline"
        assert time.monotonic() < soak.deadline
        assert watcher.failure is None, watcher.failure

        # every call has ended: once the writers wrote what they kept, the ledger is whole
        for gw in in_process:
            writer = gw.app.writer
            wait_for("the records", lambda w=writer: w.queued == 0 and w.ledger_buffered == 0)
        wait_for("the serve process's records", lambda: waiting(process.url) == 0)
        cut_off = check_answers(soak)
        spent, holding = check_ledger(pg, upstreams, soak, dead, cut_off)
        # never more spent and held together than the limit, in any snapshot as it went
        assert watcher.samples and max(watcher.samples) <= LIMIT, max(watcher.samples)
        check_counts(soak.urls, process.url, spent, holding)
    finally:
        if process is not None:
            process.stop()
        for gw in in_process:
            gw.stop()
        proxy.stop()
