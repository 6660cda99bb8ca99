"""Rate and concurrency limits (docs/budgets.md, "Rate and concurrency limits"): a call
over a requests or tokens window is a 429 with the wait after which it fits, in the
shape of its front; within a concurrency limit a call waits its turn, a caller capped
below a profile's places never holds more than its cap while another caller gets one,
and a full queue refuses at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.e2e.test_budgets import HI, client, key, post, start
from tests.e2e.test_operations import P, by_name, scrape
from tests.fakes.common import Reply
from tests.fakes.tcp_proxy import TcpProxy
from tests.postgres_db import SERVER_PORT, PgDatabase

# reads /metrics
ADMIN = {**key("ops"), "admin": True}


def limited(name: str, **limits: Any) -> dict[str, Any]:
    return {**key(name), "rate_limits": limits}


def message(gw: Gateway, name: str) -> httpx.Response:
    """A call through the Anthropic Messages front."""
    headers = {"x-api-key": name, "anthropic-version": "2023-06-01"}
    body = {"model": "gpt", "max_tokens": 50, "messages": HI}
    return httpx.post(gw.url + "/v1/messages", json=body, headers=headers, timeout=30)


def test_a_call_over_a_requests_window_is_told_when_it_fits_in_its_fronts_words(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    keys = [limited("ci", requests={"limit": 2, "window_s": 60}), ADMIN]
    gw = start(start_gateway, upstreams, keys)
    upstreams.openai.queue(Reply(content="one"), Reply(content="two"))
    assert [post(gw, "ci").status_code for _ in range(2)] == [200, 200]
    over = post(gw, "ci")
    assert over.status_code == 429
    error = over.json()["error"]
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    assert "caller 'ci' is over its requests limit" in error["message"]
    # the sliding window weighs the window before it: its two calls weigh one half-way
    # through the next (90 s from now at most)
    assert 1 <= int(over.headers["retry-after"]) <= 90
    # the same refusal through the Messages front, in Anthropic's shape
    anthropic = message(gw, "ci")
    assert anthropic.status_code == 429
    assert anthropic.json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(anthropic.headers["retry-after"]) <= 90
    refused = [c for c in gw.calls() if c["error_code"] == "rate_limit_exceeded"]
    assert len(refused) == 2 and all(c["attempts"] == 0 for c in refused)
    counted = by_name(scrape(gw, "ops"), P + "rate_limited_calls_total", "limit")
    assert counted == {"window": 2, "in_flight": 0}


def test_a_full_tokens_window_refuses_the_tasks_next_call_until_it_empties(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start(
        start_gateway,
        upstreams,
        [key("ci")],
        rate_limits={"per_task": {"tokens": {"limit": 5, "window_s": 2}}},
    )
    upstreams.openai.queue(*[Reply(content="some words to count") for _ in range(3)])
    assert post(gw, "ci", task="t").status_code == 200  # admitted while the window had room
    over = post(gw, "ci", task="t")
    assert over.status_code == 429 and over.json()["error"]["type"] == "tokens"
    assert "task 't' is over its tokens limit" in over.json()["error"]["message"]
    assert post(gw, "ci", task="other").status_code == 200  # each task on its own
    deadline = time.monotonic() + 10
    while post(gw, "ci", task="t").status_code != 200:
        assert time.monotonic() < deadline, "the window did not empty"
        time.sleep(0.5)


def test_input_and_output_token_windows_count_the_prompt_and_the_answer_apart(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    windows = {
        "input_tokens": {"limit": 10**6, "window_s": 600},
        "output_tokens": {"limit": 3, "window_s": 600},
    }
    gw = start(start_gateway, upstreams, [limited("ci", **windows), ADMIN])
    upstreams.openai.queue(Reply(content="some words to count"))
    first = post(gw, "ci")
    assert first.status_code == 200
    usage = first.json()["usage"]
    assert usage["completion_tokens"] > 3
    deadline = time.monotonic() + 10
    while True:  # what the call spent is added once it ends
        over = post(gw, "ci")
        if over.status_code == 429:
            break
        assert time.monotonic() < deadline, "the output window never filled"
        time.sleep(0.05)
    assert over.json()["error"]["type"] == "tokens"
    assert "caller 'ci' is over its output_tokens limit" in over.json()["error"]["message"]
    seen = httpx.get(
        gw.url + "/ui/api/limits", headers={"Authorization": "Bearer ops"}, timeout=10
    ).json()
    used = {w["metric"]: w["used"] for w in seen["windows"] if w["name"] == "ci"}
    assert used == {
        "input_tokens": usage["prompt_tokens"],
        "output_tokens": usage["completion_tokens"],
    }


def test_a_caller_capped_below_a_profiles_places_never_holds_more_and_others_get_one(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start(
        start_gateway,
        upstreams,
        [key("a"), key("b"), ADMIN],
        rate_limits={
            "profiles": {"gpt": {"in_flight": 2, "in_flight_per_caller": 1}},
            "max_waiting": 2,
            "max_wait_s": 20,
        },
    )
    upstreams.openai.queue(*[Reply(content="slow", delay_ms=600) for _ in range(4)])
    places = gw.app.limits
    held_by_a: list[int] = []
    statuses: dict[str, list[int]] = {"a": [], "b": []}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            limit = places.in_flight.get(("profile", "gpt"))
            if limit is not None:
                held_by_a.append(limit.held("a"))
            time.sleep(0.005)

    def send(name: str) -> None:
        statuses[name].append(post(gw, name).status_code)

    watcher = threading.Thread(target=watch)
    watcher.start()
    a_calls = [threading.Thread(target=send, args=("a",)) for _ in range(3)]
    for t in a_calls:
        t.start()
    time.sleep(0.2)  # a's first holds its one place; two of a's wait
    b_call = threading.Thread(target=send, args=("b",))
    started = time.monotonic()
    b_call.start()
    b_call.join(30)
    b_took = time.monotonic() - started
    for t in a_calls:
        t.join(30)
    done.set()
    watcher.join(5)
    assert max(held_by_a) == 1  # never two, though the profile had two places
    assert statuses["b"] == [200] and b_took < 1.2  # the other place was b's at once
    # a's second and third waited their turn and were served when a place freed
    assert sorted(statuses["a"]) == [200, 200, 200]
    # the queue's bound: with two of a's waiting, a third waiter is refused at once
    upstreams.openai.queue(*[Reply(content="slow", delay_ms=800) for _ in range(3)])
    results: list[int] = []
    waiters = [threading.Thread(target=lambda: results.append(post(gw, "a").status_code))]
    waiters += [threading.Thread(target=lambda: results.append(post(gw, "a").status_code))]
    waiters += [threading.Thread(target=lambda: results.append(post(gw, "a").status_code))]
    for t in waiters:
        t.start()
        time.sleep(0.1)
    time.sleep(0.2)
    full = post(gw, "a")
    for t in waiters:
        t.join(30)
    assert full.status_code == 429 and full.headers["retry-after"] == "1"
    assert "found 2 calls already waiting" in full.json()["error"]["message"]
    assert sorted(results) == [200, 200, 200]
    assert by_name(scrape(gw, "ops"), P + "rate_limited_calls_total", "limit")["in_flight"] == 1
    assert by_name(scrape(gw, "ops"), P + "limited_calls_in_flight", "holder")["profile"] == 0


def test_gateways_sharing_a_database_count_a_callers_requests_together(
    pg: PgDatabase, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    keys = [limited("ci", requests={"limit": 3, "window_s": 60})]
    gateways = [start(start_gateway, upstreams, keys, database=pg.url) for _ in range(2)]
    upstreams.openai.queue(*[Reply(content="ok") for _ in range(3)])
    statuses = [post(gateways[n % 2], "ci").status_code for n in range(4)]
    assert statuses == [200, 200, 200, 429]  # the fourth over the three both counted
    rows = pg.fetch("SELECT current, previous FROM rate_windows WHERE name = 'ci'")
    assert [(r["current"] + r["previous"]) for r in rows] == [3]


def test_calls_at_once_on_gateways_sharing_a_database_never_pass_the_window_together(
    pg: PgDatabase, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    keys = [limited("ci", requests={"limit": 5, "window_s": 600})]
    gateways = [start(start_gateway, upstreams, keys, database=pg.url) for _ in range(2)]
    upstreams.openai.queue(*[Reply(content="ok") for _ in range(20)])
    statuses: list[int] = []
    lock = threading.Lock()

    def send(n: int) -> None:
        status = post(gateways[n % 2], "ci").status_code
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=send, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # each window's row is locked while a call reads and writes it: none is lost
    assert sorted(statuses) == [200] * 5 + [429] * 15


def test_gateways_sharing_a_database_add_each_calls_tokens_to_the_tasks_window(
    pg: PgDatabase, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    limits = {"per_task": {"tokens": {"limit": 5, "window_s": 600}}}
    gateways = [
        start(start_gateway, upstreams, [key("ci")], database=pg.url, rate_limits=limits)
        for _ in range(2)
    ]
    upstreams.openai.queue(Reply(content="some words to count"))
    assert post(gateways[0], "ci", task="t").status_code == 200
    deadline = time.monotonic() + 10
    while True:  # settled off the call's path
        rows = pg.fetch("SELECT current FROM rate_windows WHERE name = 't'")
        if rows and rows[0]["current"] > 0:
            break
        assert time.monotonic() < deadline, "the call's tokens were not counted"
        time.sleep(0.05)
    over = post(gateways[1], "ci", task="t")  # the other gateway sees the window full
    assert over.status_code == 429 and over.json()["error"]["type"] == "tokens"


@pytest.mark.parametrize(("when_down", "status"), [("fail_open", 200), ("fail_closed", 503)])
def test_a_rate_limits_database_that_does_not_answer_lets_calls_through_or_refuses_them(
    pg: PgDatabase,
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    tmp_path: Path,
    when_down: str,
    status: int,
) -> None:
    proxy = TcpProxy(target_port=SERVER_PORT).start()
    try:
        gw = start(
            start_gateway,
            upstreams,
            [limited("ci", requests={"limit": 100}), ADMIN],
            database=pg.url_at(proxy.port),
            ledger=f"sqlite:///{tmp_path / 'ledger.db'}",
            rate_limits={"when_store_down": when_down},
        )
        upstreams.openai.queue(*[Reply(content="ok") for _ in range(3)])
        assert post(gw, "ci").status_code == 200
        proxy.cut()
        answer = post(gw, "ci")
        assert answer.status_code == status, answer.text
        if status == 503:
            assert answer.json()["error"]["code"] == "rate_limit_store_unavailable"
            assert answer.headers["retry-after"] == "1"
        else:
            assert gw.app.limits.counts.uncounted == 1
        proxy.restore()
    finally:
        proxy.stop()


def test_the_limits_view_shows_windows_places_and_what_calls_in_flight_hold(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    ci = {**limited("ci", requests={"limit": 10}, in_flight=1), "budget": {"max_tokens": 10**6}}
    gw = start(start_gateway, upstreams, [ci, ADMIN])
    upstreams.openai.queue(Reply(content="slow", delay_ms=1500))
    call = threading.Thread(target=post, args=(gw, "ci"), kwargs={"max_tokens": 100})
    call.start()

    def view() -> dict[str, Any]:
        headers = {"Authorization": "Bearer ops"}
        answer = httpx.get(gw.url + "/ui/api/limits", headers=headers, timeout=10)
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    deadline = time.monotonic() + 10
    while not (seen := view())["in_flight"] or seen["in_flight"][0]["in_flight"] == 0:
        assert time.monotonic() < deadline, "the call never held its place"
        time.sleep(0.05)
    assert seen["in_flight"] == [
        {
            "holder": "caller",
            "name": "ci",
            "in_flight": 1,
            "waiting": 0,
            "limit": 1,
            "per_caller": None,
        }
    ]
    (requests,) = seen["windows"]
    assert (requests["name"], requests["metric"], requests["limit"]) == ("ci", "requests", 10)
    assert requests["used"] == 1
    (budget,) = seen["budgets"]
    assert budget["held"] > 100 and budget["left"] == 10**6 - budget["spent"] - budget["held"]
    call.join(30)
    assert gw.app.bus.flush(10)
    after = view()
    # a limit nobody holds or waits for is let go: the view lists those in use
    assert after["in_flight"] == [] and after["budgets"][0]["held"] == 0


def test_the_sdks_read_a_rate_limit_refusal_as_their_own_rate_limit_error(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start(start_gateway, upstreams, [limited("ci", requests={"limit": 1, "window_s": 60})])
    upstreams.openai.queue(Reply(content="one"))
    assert post(gw, "ci").status_code == 200
    chat = client(gw, "ci", max_retries=0)
    with pytest.raises(openai.RateLimitError) as refused:
        chat.chat.completions.create(model="gpt", messages=HI)
    assert refused.value.code == "rate_limit_exceeded" and refused.value.type == "requests"
    assert int(refused.value.response.headers["retry-after"]) >= 1
    messages = anthropic.Anthropic(base_url=gw.url, api_key="ci", max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as over:
        messages.messages.create(model="gpt", max_tokens=20, messages=HI)
    assert int(over.value.response.headers["retry-after"]) >= 1


def test_with_budgets_and_windows_shared_a_call_over_its_budget_is_refused_without_waiting(
    pg: PgDatabase, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    # one place, two requests a window, and a budget that a call capped at 150 tokens
    # fits in (it reserves some 1,200) but one capped at 1,500 does not
    caller = {
        **key("ci", {"max_tokens": 2000, "per": "day"}),
        "rate_limits": {"requests": {"limit": 2, "window_s": 600}, "in_flight": 1},
    }
    gw = start(start_gateway, upstreams, [caller], database=pg.url, metering={"sync": True})
    upstreams.openai.queue(Reply(content="slow", delay_ms=3000))
    first: list[int] = []
    holder = threading.Thread(
        target=lambda: first.append(post(gw, "ci", max_tokens=150).status_code)
    )
    holder.start()
    deadline = time.monotonic() + 10
    while not pg.fetch("SELECT 1 FROM budget_reservations"):  # the first call holds its place
        assert time.monotonic() < deadline, "the first call never started"
        time.sleep(0.02)
    # over its budget while the place it would wait for is held: refused at once, not
    # after waiting for the place; counted in the window all the same
    began = time.monotonic()
    over_budget = post(gw, "ci", max_tokens=1500)
    assert over_budget.status_code == 429, over_budget.text
    assert over_budget.json()["error"]["code"] == "budget_exceeded"
    assert time.monotonic() - began < 2.0 and holder.is_alive()
    # the window counted both: the third call is over it, and the reservation it was
    # given meanwhile goes with its record
    over_rate = post(gw, "ci", max_tokens=10)
    assert over_rate.status_code == 429
    assert over_rate.json()["error"]["code"] == "rate_limit_exceeded"
    holder.join(10)
    assert first == [200]
    assert pg.fetch("SELECT count(*) AS n FROM budget_reservations")[0]["n"] == 0
    rows = pg.fetch("SELECT error_code FROM model_calls WHERE caller = 'ci' ORDER BY started_at")
    assert sorted(str(r["error_code"]) for r in rows) == [
        "None",
        "budget_exceeded",
        "rate_limit_exceeded",
    ]
