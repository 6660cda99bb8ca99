"""Budgets several gateways share (docs/budgets.md, "Several gateways"): three gateways
on one PostgreSQL ledger, callers on each at once, one key's budget; a call capped by
``max_tokens`` is admitted only where all it may spend fits in what every gateway's
calls left, so what the ledger holds never passes the limit; each call is one row; a
database that does not answer refuses calls (``fail_closed``) or lets them through
(``fail_open``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from boundedcode_gateway.cli.budgets import run_budgets
from tests.e2e.conftest import GatewayFactory, Upstreams
from tests.e2e.test_budgets import key, post, start
from tests.e2e.test_operations import P, by_name, scrape
from tests.fakes.common import Reply
from tests.fakes.tcp_proxy import TcpProxy
from tests.postgres_db import SERVER_PORT, PgDatabase

# a call of HI capped at 150 tokens reserves some 1,200 (its bytes, the template's 1,024,
# its cap) and spends some 160: the budget fits one such reservation beside what was
# spent, so calls queue on it until the ledger is near the limit
LIMIT = 2000
CALLERS = 12
CALLS_EACH = 4
# each answer as long as its cap allows, and slow enough that calls overlap
ANSWER = Reply(content="word " * 400, delay_ms=100)


HELD_SQL = """
SELECT (SELECT COALESCE(SUM(tokens), 0) FROM budget_spent
        WHERE kind = 'caller' AND name = 'ci' AND day = '') AS spent,
       (SELECT COALESCE(SUM(tokens), 0) FROM budget_reservations
        WHERE kind = 'caller' AND name = 'ci' AND expires_at > now()) AS held
"""


def spent_in_ledger(pg: PgDatabase, caller: str) -> int:
    rows = pg.fetch(
        "SELECT COALESCE(SUM(COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0)), 0)"
        " AS n FROM model_calls WHERE caller = $1",
        caller,
    )
    return int(rows[0]["n"])


def test_callers_on_three_gateways_never_spend_past_a_shared_budget_with_capped_calls(
    pg: PgDatabase, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    settings: dict[str, Any] = {"ledger": pg.url, "metering": {"sync": True}}
    keys = [key("ci", {"max_tokens": LIMIT, "per": "day"})]
    gateways = [start(start_gateway, upstreams, keys, **settings) for _ in range(3)]
    upstreams.openai.queue(*[ANSWER for _ in range(CALLERS * CALLS_EACH)])
    statuses: list[int] = []
    lock = threading.Lock()

    def caller(n: int) -> None:
        for m in range(CALLS_EACH):
            status = post(gateways[(n + m) % 3], "ci", max_tokens=150).status_code
            with lock:
                statuses.append(status)

    held: list[int] = []
    done = threading.Event()

    def watch() -> None:
        # what was spent and what the calls in flight hold, in one snapshot, as they go
        while not done.is_set():
            row = pg.fetch(HELD_SQL)[0]
            held.append(int(row["spent"]) + int(row["held"]))
            time.sleep(0.01)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(CALLERS)]
    watcher = threading.Thread(target=watch)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    done.set()
    watcher.join(10)
    assert len(statuses) == CALLERS * CALLS_EACH and set(statuses) <= {200, 429}
    assert statuses.count(200) >= 2 and statuses.count(429) >= 1
    # never more held and spent together than the budget: each call fit whole
    assert held and max(held) <= LIMIT, max(held)
    # calls were refused for not fitting whole while something was left
    words = [c["error_message"] for g in gateways for c in g.calls() if c["status"] != "ok"]
    assert any("this call may spend up to" in w for w in words)
    spent = spent_in_ledger(pg, "ci")
    assert 0 < spent <= LIMIT
    # every request is one row, whichever gateway took it; nothing is still held
    rows = pg.fetch("SELECT call_id FROM model_calls WHERE caller = 'ci'")
    assert len(rows) == len({r["call_id"] for r in rows}) == CALLERS * CALLS_EACH
    assert pg.fetch("SELECT count(*) AS n FROM budget_reservations")[0]["n"] == 0
    # what the budgets count is what the ledger holds
    counted = pg.fetch(
        "SELECT tokens FROM budget_spent WHERE kind = 'caller' AND name = 'ci' AND day = ''"
    )
    assert counted[0]["tokens"] == spent


@pytest.mark.parametrize(("when_down", "status"), [("fail_closed", 503), ("fail_open", 200)])
def test_a_budgets_database_that_does_not_answer_refuses_or_lets_calls_through(
    pg: PgDatabase,
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    when_down: str,
    status: int,
) -> None:
    proxy = TcpProxy(target_port=SERVER_PORT).start()
    try:
        gw = start(
            start_gateway,
            upstreams,
            [key("ci", {"max_tokens": 10**9}), {**key("ops"), "admin": True}],
            ledger=pg.url_at(proxy.port),
            budgets={"when_store_down": when_down},
        )
        upstreams.openai.queue(*[Reply(content="ok") for _ in range(3)])
        assert post(gw, "ci").status_code == 200
        proxy.cut()
        started = time.monotonic()
        answer = post(gw, "ci")
        assert answer.status_code == status, answer.text
        assert time.monotonic() - started < 10
        found = scrape(gw, "ops")
        if status == 503:
            assert answer.json()["error"]["code"] == "budget_store_unavailable"
            assert answer.headers["retry-after"] == "1"
            assert found[(P + "budgets_database_up", frozenset())] == 0
            failed = by_name(found, P + "budgets_unavailable_operations_total", "operation")
            assert failed["reserve"] >= 1
        else:
            assert found[(P + "budgets_unreserved_calls_total", frozenset())] == 1
        proxy.restore()
        deadline = time.monotonic() + 30
        while post(gw, "ci").status_code != 200:
            assert time.monotonic() < deadline, "budgets did not come back with the database"
            time.sleep(0.5)
    finally:
        proxy.stop()


def test_the_budgets_command_shows_what_calls_in_flight_hold(
    pg: PgDatabase,
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    gw = start(start_gateway, upstreams, [key("ci", {"max_tokens": 100_000})], ledger=pg.url)
    upstreams.openai.queue(Reply(content="slow", delay_ms=1500))
    call = threading.Thread(target=post, args=(gw, "ci"), kwargs={"max_tokens": 100})
    started = time.monotonic()
    call.start()
    while not pg.fetch("SELECT call_id FROM budget_reservations"):
        assert time.monotonic() - started < 5, "the call reserved nothing"
        time.sleep(0.02)
    assert run_budgets(gw.app.config) == 0
    printed = capsys.readouterr().out
    held_row = printed.splitlines()[1].split()
    call.join(30)
    # holder name per limit spent held allowed left: the call holds its prompt's bound
    # and its cap, and the rest is left
    assert held_row[:5] == ["caller", "ci", "day", "max_tokens", "0"]
    held = int(held_row[5].replace(",", ""))
    assert held > 100 and int(held_row[7].replace(",", "")) == 100_000 - held
    # held until the call's ledger row is written, then spent
    assert gw.app.bus.flush(10.0) and gw.app.writer.flush(10.0)
    assert run_budgets(gw.app.config) == 0
    after = capsys.readouterr().out.splitlines()[1].split()
    assert after[5] == "0" and int(after[4].replace(",", "")) > 0


def test_the_limits_view_of_gateways_sharing_a_database_shows_every_gateways_calls(
    pg: PgDatabase, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    keys = [
        {**key("ci", {"max_tokens": 10**6}), "rate_limits": {"requests": {"limit": 10}}},
        {**key("ops"), "admin": True},
    ]
    first, second = (start(start_gateway, upstreams, keys, database=pg.url) for _ in range(2))
    upstreams.openai.queue(Reply(content="ok"), Reply(content="slow", delay_ms=1500))
    assert post(first, "ci", max_tokens=50).status_code == 200
    assert first.app.bus.flush(10) and first.app.writer.flush(10)
    call = threading.Thread(target=post, args=(first, "ci"), kwargs={"max_tokens": 100})
    call.start()
    deadline = time.monotonic() + 10
    headers = {"Authorization": "Bearer ops"}
    while True:  # read through the other gateway
        seen = httpx.get(second.url + "/ui/api/limits", headers=headers, timeout=10).json()
        if seen["budgets"] and seen["budgets"][0]["held"] > 0:
            break
        assert time.monotonic() < deadline, "the call's reservation was never seen"
        time.sleep(0.05)
    call.join(30)
    (budget,) = seen["budgets"]
    assert budget["spent"] > 0 and budget["held"] > 100
    (requests,) = seen["windows"]
    assert (requests["name"], requests["metric"], requests["used"]) == ("ci", "requests", 2)
