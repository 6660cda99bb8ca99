"""Soak on PostgreSQL: two gateways, each with its own data_dir, share one database for
their ledger and task state (``ledger:`` and ``state:``), serve requests through the
faults of test_soak.py, and the database is cut off mid-run for a few seconds.

Bounded in count and time, loopback only, seeded. Both gateways reach the database
through a TCP proxy of the test's own (tests/fakes/tcp_proxy.py): the real server is never
stopped. While it is cut, calls go on being answered, also by the gateway whose answers
wait for their records (``metering.sync``). Once it is back every request is exactly one
row, nothing dropped, and a task served in turn by both gateways after the cut, amid the
load, still gets its reasoning back and its ``changed``. With a small
``metering.ledger_buffer_records`` the oldest records of the cut are dropped, and counted:
rows and drops add up to the requests exactly.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from boundedcode_gateway.database.pool import RETRY_AFTER_S
from boundedcode_gateway.operations.metrics import PREFIX
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE
from tests.e2e.conftest import Gateway, GatewayFactory
from tests.e2e.every_kind import Fakes, fakes
from tests.e2e.test_pg_state import TURNS, Conversation, changed_of, reasoning_sent
from tests.e2e.test_soak import PER_REQUEST_TIMEOUT_S, READ_TIMEOUT_S, faulty_replies, one_request
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import serve_in_thread
from tests.fakes.tcp_proxy import TcpProxy
from tests.postgres_db import PgDatabase

__all__ = ["fakes"]  # the module-scoped fixture

REQUESTS = 600
CONCURRENCY = 16
# the whole load, well inside pytest-timeout's 120 s per test (it takes some 15 s here)
DEADLINE_S = 60.0
# the database is cut once this many requests are answered, for at least CUT_S
CUT_AFTER = REQUESTS // 3
CUT_S = 3.0
# the soak's buffer: far above the records a cut of a few seconds leaves waiting
BUFFER = 5000
# the small buffer's variant: requests before the cut, during it, and the bound
SMALL_BEFORE = 40
SMALL_DURING = 80
SMALL_BUFFER = 20
# the writer tries again 0.5 s after a failure, doubling: a cut of a few seconds is over
# within a try or two
SETTLE_S = 40.0
# the soak's profiles: the local llama fake as "llama", the other local one, and every
# cloud kind; "local" is kept for the task served in turn (test_pg_state's Conversation)
SOAK_KINDS = [
    ("llama", "local", "llama", True),
    ("other", "other", "other", True),
    ("gpt", "gpt", "openai", False),
    ("glm", "glm", "compat", False),
    ("claude", "claude", "claude", False),
    ("gem", "gem", "gemini", False),
]
MODELS = [profile for profile, _, _, _ in SOAK_KINDS]
# the history rows behind `changed` of a few tasks, swapped by both gateways in turn
TASKS = ["soak-a", "soak-b", "soak-c", "default"]
TURN_TASK = "in-turn"
# the cache keeper's follow-ups have their own tests (test_cache_keeper.py), and would
# take room in the small buffer
NO_REPAIR = {"server": {"cache_repair": False}}


@dataclass(frozen=True)
class Done:
    """One request of the load: which gateway served it, how it ended, and when."""

    gateway: int
    outcome: str
    started: float
    ended: float


@dataclass
class Cut:
    """The soak's outage: ``reached`` once CUT_AFTER requests are answered (the database is
    cut then); the last third of the requests waits for ``resume`` (it is back, and the
    task served in turn under way). When it was cut and restored, and what each writer
    kept just before."""

    reached: asyncio.Event = field(default_factory=asyncio.Event)
    resume: asyncio.Event = field(default_factory=asyncio.Event)
    at: float = 0.0
    restored: float = 0.0
    buffered: list[int] = field(default_factory=list)


def soak_profiles(fakes: Fakes, turns_url: str | None = None) -> dict[str, dict[str, Any]]:
    profiles: dict[str, dict[str, Any]] = {}
    for profile, source, _, local in SOAK_KINDS:
        profiles[profile] = {**fakes.profiles[source], **(NO_REPAIR if local else {})}
    if turns_url is not None:
        profiles["local"] = {"provider": "local", "external_url": turns_url, **NO_REPAIR}
    return profiles


def queue_faults(fakes: Fakes, seed: int, n: int) -> None:
    rng = random.Random(seed)
    fakes.reset()
    for _, _, attr, local in SOAK_KINDS:
        getattr(fakes, attr).queue(*faulty_replies(rng, n, local))


async def load(
    urls: Sequence[str],
    seed: int,
    n: int,
    cut: Cut | None = None,
    during: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> list[Done]:
    """``n`` requests of test_soak.py's kinds, each to a gateway and a task drawn from the
    seed, in step with ``cut`` if given; ``during`` runs alongside."""
    rng = random.Random(seed)
    sem = asyncio.Semaphore(CONCURRENCY)
    done: list[Done] = []
    timeout = aiohttp.ClientTimeout(total=PER_REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def run(i: int) -> None:
            if cut is not None and i >= n - n // 3:
                await cut.resume.wait()
            async with sem:
                # drawn together, before any await: each request's draws are one group
                gateway = rng.randrange(len(urls))
                headers = {"X-BoundedCode-Task": rng.choice(TASKS)}
                started = time.monotonic()
                try:
                    outcome = await one_request(session, urls[gateway], rng, MODELS, headers)
                except TimeoutError:
                    outcome = "hung"
                done.append(Done(gateway, outcome, started, time.monotonic()))
                if cut is not None and len(done) == CUT_AFTER:
                    cut.reached.set()

        work = [run(i) for i in range(n)]
        if during is not None:
            work.append(during())
        await asyncio.wait_for(asyncio.gather(*work), DEADLINE_S)
    return done


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def scraped(gateway: Gateway) -> dict[str, float]:
    """The metering and state samples of the gateway's /metrics, labelled ones summed."""
    body = httpx.get(gateway.url + "/metrics", timeout=10).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name.startswith((f"{PREFIX}_metering_", f"{PREFIX}_state_")):
                name = sample.name.removeprefix(f"{PREFIX}_")
                found[name] = found.get(name, 0.0) + sample.value
    return found


def ledger_ids(pg: PgDatabase) -> list[str]:
    rows = pg.fetch("SELECT call_id, purpose FROM model_calls ORDER BY seq")
    return [r["call_id"] for r in rows if r["purpose"] != REPAIR_PURPOSE]


def settle(gateways: Sequence[Gateway], expected: Sequence[int], drained: bool = True) -> None:
    """Wait until each gateway's call log has its calls (a caller that hung up is recorded
    when the gateway's side ends) and, if ``drained``, its writer keeps nothing for the
    ledger; then each call log has its calls exactly."""
    wait_for(
        lambda: (
            all(len(g.calls()) >= n for g, n in zip(gateways, expected, strict=True))
            and not (drained and any(g.app.writer.ledger_buffered for g in gateways))
        ),
        SETTLE_S,
        "every call in the call logs" + (" and the ledger" if drained else ""),
    )
    assert [len(g.calls()) for g in gateways] == list(expected)


@pytest.fixture
def turns() -> Iterator[tuple[FakeLlamaServer, str]]:
    """The local server of the task served in turn, and its URL: its replies apart from
    the soak's."""
    fake = FakeLlamaServer()
    with serve_in_thread(fake.app) as server:
        yield fake, server.url


# Thousands of sockets close here, some from threads the collector reaches late.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_two_gateways_on_postgresql_through_faults_and_a_database_cut(
    pg: PgDatabase,
    pg_proxy: TcpProxy,
    fakes: Fakes,
    turns: tuple[FakeLlamaServer, str],
    start_gateway: GatewayFactory,
) -> None:
    queue_faults(fakes, seed=20261201, n=REQUESTS)
    turns_fake, turns_url = turns
    turns_fake.queue(*TURNS)
    profiles = soak_profiles(fakes, turns_url)
    through = pg.url_at(pg_proxy.port)
    common = {"ledger": through, "state": through, "inference": {"read_timeout_s": READ_TIMEOUT_S}}
    # the first gateway's answers wait for their records: not for a database that is away
    gateways = [
        start_gateway(profiles, **common, metering={"sync": sync, "ledger_buffer_records": BUFFER})
        for sync in (True, False)
    ]
    writers = [g.app.writer for g in gateways]
    cut = Cut()
    conversation = Conversation(TURN_TASK)

    async def cut_then_turns() -> None:
        await cut.reached.wait()
        await asyncio.to_thread(pg_proxy.cut)
        cut.at = time.monotonic()
        await asyncio.sleep(CUT_S)
        # both ledgers met the cut: each writer keeps records for it
        deadline = time.monotonic() + 20.0
        while not all(w.ledger_buffered for w in writers):
            assert time.monotonic() < deadline, "a writer kept nothing during the cut"
            await asyncio.sleep(0.05)
        cut.buffered = [w.ledger_buffered for w in writers]
        await asyncio.to_thread(pg_proxy.restore)
        cut.restored = time.monotonic()
        # past the state database's pause after its last failure: every call tries it again
        await asyncio.sleep(RETRY_AFTER_S + 0.2)
        cut.resume.set()
        # one task served by the two gateways in turn, amid the last third of the load
        for n in range(len(TURNS)):
            await asyncio.to_thread(conversation.turn, gateways[n % 2], n)

    started = time.monotonic()
    urls = [g.url + "/v1/chat/completions" for g in gateways]
    done = asyncio.run(load(urls, seed=2, n=REQUESTS, cut=cut, during=cut_then_turns))
    elapsed = time.monotonic() - started

    outcomes = Counter(d.outcome for d in done)
    assert len(done) == REQUESTS
    assert "hung" not in outcomes, outcomes
    assert outcomes["ok"] + outcomes["ok_after_discard"] > REQUESTS // 2, outcomes
    # calls went on being answered while the database was away: whole ones, on both
    within = [
        sum(1 for d in done if d.gateway == g and cut.at <= d.started and d.ended <= cut.restored)
        for g in (0, 1)
    ]
    assert min(within) >= CONCURRENCY, (within, cut)
    assert all(0 < n < BUFFER for n in cut.buffered), cut

    sent = [sum(1 for d in done if d.gateway == g) for g in (0, 1)]
    turns_each = [len(range(g, len(TURNS), 2)) for g in (0, 1)]
    settle(gateways, [s + t for s, t in zip(sent, turns_each, strict=True)])
    logged = [c["call_id"] for g in gateways for c in g.calls()]
    rows = ledger_ids(pg)
    # every request of either gateway is exactly one row: none missing, none twice
    assert len(logged) == len(set(logged)) == REQUESTS + len(TURNS)
    assert len(rows) == len(set(rows)) == len(logged)
    assert set(rows) == set(logged)
    for gateway in gateways:
        metrics = scraped(gateway)
        assert metrics["metering_ledger_dropped_records_total"] == 0.0
        assert metrics["metering_ledger_buffered_records"] == 0.0
        assert metrics["metering_errors_total"] >= 1.0  # the cut was met, and survived
        assert metrics["state_database_up"] == 1.0
        assert metrics["state_unavailable_operations_total"] >= 1.0
        assert gateway.app.writer.ledger_dropped == 0

    # the task served in turn after the cut: every turn went upstream with every earlier
    # answer's reasoning, whichever gateway kept it, and `changed` as one gateway has it
    bodies = [r.body for r in turns_fake.requests if r.method == "POST"]
    histories = [b["messages"] for b in bodies if "messages" in b]
    assert len(histories) == len(TURNS)
    for n, messages in enumerate(histories):
        assert reasoning_sent(messages) == [t.reasoning_content for t in TURNS[:n]]
    calls = gateways[0].calls() + gateways[1].calls()
    assert changed_of(calls, TURN_TASK) == [-1, -1, -1, -1, 0, -1]
    print(
        f"\npg soak: {REQUESTS} requests in {elapsed:.1f} s; {within} answered "
        f"within the {cut.restored - cut.at:.1f} s cut; kept {cut.buffered}; {dict(outcomes)}"
    )


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_small_ledger_buffer_drops_the_oldest_of_a_cut_and_counts_each(
    pg: PgDatabase, pg_proxy: TcpProxy, fakes: Fakes, start_gateway: GatewayFactory
) -> None:
    queue_faults(fakes, seed=20261202, n=SMALL_BEFORE + SMALL_DURING)
    settings = {
        "ledger": pg.url_at(pg_proxy.port),
        "inference": {"read_timeout_s": READ_TIMEOUT_S},
        "metering": {"ledger_buffer_records": SMALL_BUFFER},
    }
    gateways = [start_gateway(soak_profiles(fakes), **settings) for _ in range(2)]
    urls = [g.url + "/v1/chat/completions" for g in gateways]

    before = asyncio.run(load(urls, seed=3, n=SMALL_BEFORE))
    sent = [sum(1 for d in before if d.gateway == g) for g in (0, 1)]
    settle(gateways, sent)
    assert len(ledger_ids(pg)) == SMALL_BEFORE

    pg_proxy.cut()
    during = asyncio.run(load(urls, seed=4, n=SMALL_DURING))
    cut_sent = [sum(1 for d in during if d.gateway == g) for g in (0, 1)]
    assert min(cut_sent) > SMALL_BUFFER  # the seed sends each gateway more than it keeps
    # every record of the cut is in the call log, and the buffer has what it could keep
    all_sent = [s + c for s, c in zip(sent, cut_sent, strict=True)]
    settle(gateways, all_sent, drained=False)
    dropped = [c - SMALL_BUFFER for c in cut_sent]
    for gateway, lost in zip(gateways, dropped, strict=True):
        metrics = scraped(gateway)
        assert metrics["metering_ledger_buffered_records"] == SMALL_BUFFER
        assert metrics["metering_ledger_dropped_records_total"] == lost > 0
    pg_proxy.restore()

    settle(gateways, all_sent)
    rows = ledger_ids(pg)
    counted = [scraped(g)["metering_ledger_dropped_records_total"] for g in gateways]
    # each request is a row or a drop on /metrics, never both, never neither
    assert len(rows) == len(set(rows))
    assert len(rows) + sum(counted) == SMALL_BEFORE + SMALL_DURING
    assert counted == dropped
    # what is missing is each gateway's oldest records of the cut, as its call log has them
    missing: set[str] = set()
    for gateway, before_n, lost in zip(gateways, sent, dropped, strict=True):
        missing |= {c["call_id"] for c in gateway.calls()[before_n : before_n + lost]}
    logged = {c["call_id"] for g in gateways for c in g.calls()}
    assert set(rows) == logged - missing
