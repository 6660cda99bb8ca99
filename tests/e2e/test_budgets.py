"""Cost and budgets, end to end: each call's ``cost_usd`` in the call log and the ledger,
and calls over a caller's or a task's budget refused with 429 ``budget_exceeded`` (raw
HTTP, the ``openai`` SDK, LiteLLM), across a day boundary, a restart, and calls in flight.

The gateway here does not authenticate callers itself: each test sets the router's
``identify`` hook, which takes the bearer token as the name of a key in ``auth.keys``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from boundedcode_gateway.access.keys import key_digest
from boundedcode_gateway.budgets.book import BudgetBook
from boundedcode_gateway.metering.calllog import read_calls
from boundedcode_gateway.metering.ledger import Ledger
from boundedcode_gateway.metering.records import CallRecord
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.e2e.test_cli import free_port, start_serve
from tests.fakes.common import Reply
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import serve_in_thread

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
import litellm
from litellm.exceptions import RateLimitError as LiteLLMRateLimitError

HI: list[Any] = [{"role": "user", "content": "hi"}]
GPT_PRICE = {"input_per_mtok": 1.25, "cached_input_per_mtok": 0.125, "output_per_mtok": 10.0}
LOCAL_PRICE = {
    "input_per_mtok": 0.5,
    "cached_input_per_mtok": 0.05,
    "output_per_mtok": 2.0,
    "gpu_second": 0.002,
}


def expected_cost(row: dict[str, Any], price: dict[str, float]) -> float:
    """The price applied to a recorded call, written out here on its own."""
    prompt, cached = row["prompt_tokens"], row["cached_tokens"] or 0
    tokens = (
        (prompt - cached) * price["input_per_mtok"]
        + cached * price.get("cached_input_per_mtok", price["input_per_mtok"])
        + row["completion_tokens"] * price["output_per_mtok"]
    ) / 1e6
    seconds = ((row["prefill_ms"] or 0.0) + (row["decode_ms"] or 0.0)) / 1000
    return float(tokens + price.get("gpu_second", 0.0) * seconds)


def key(name: str, budget: dict[str, Any] | None = None) -> dict[str, Any]:
    # the key is the caller's name: tests send the name as their api_key
    entry: dict[str, Any] = {"name": name, "sha256": key_digest(name), "models": ["*"]}
    if budget is not None:
        entry["budget"] = budget
    return entry


def start(
    start_gateway: GatewayFactory,
    upstreams: Upstreams,
    keys: list[dict[str, Any]] | None = None,
    **settings: Any,
) -> Gateway:
    if keys is not None:
        settings["auth"] = {"keys": keys}
    gw = start_gateway(upstreams.profiles, **settings)
    return gw


def client(gw: Gateway, name: str, task: str | None = None, **options: Any) -> openai.OpenAI:
    headers = {"X-BoundedCode-Task": task} if task else {}
    made = openai.OpenAI(base_url=gw.url + "/v1", api_key=name, default_headers=headers, **options)
    gw.clients.append(made)
    return made


def post(
    gw: Gateway,
    name: str,
    model: str = "gpt",
    task: str | None = None,
    max_tokens: int | None = None,
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {name}"}
    if task:
        headers["X-BoundedCode-Task"] = task
    body: dict[str, Any] = {"model": model, "messages": HI}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def refused(gw: Gateway) -> list[dict[str, Any]]:
    return [c for c in gw.calls() if c["error_code"] == "budget_exceeded"]


# -- cost


def test_each_call_is_priced_in_the_call_log_and_the_ledger(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    profiles = upstreams.profiles
    profiles["gpt"] = {**profiles["gpt"], "price": GPT_PRICE}
    profiles["local"] = {**profiles["local"], "price": LOCAL_PRICE}
    gw = start_gateway(profiles)
    cli = gw.client()
    # a prompt past OpenAI's 1024-token cache threshold, sent twice: the second is cached
    long: list[Any] = [{"role": "user", "content": "word " * 1500}]
    for model, messages in [("gpt", long), ("gpt", long), ("local", HI), ("local", HI)]:
        cli.chat.completions.create(model=model, messages=messages)
    stream = cli.chat.completions.create(model="gpt", messages=long, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    cli.chat.completions.create(model="glm", messages=HI)

    calls, rows = gw.calls(), gw.ledger_rows()
    assert [c["model_profile"] for c in calls] == ["gpt", "gpt", "local", "local", "gpt", "glm"]
    assert calls[1]["cached_tokens"] >= 1024 and calls[3]["cached_tokens"] > 0
    assert calls[2]["prefill_ms"] > 0 and calls[2]["decode_ms"] > 0
    for call, row in zip(calls, rows, strict=True):
        assert row["cost_usd"] == call["cost_usd"]
        if call["model_profile"] == "glm":
            assert call["cost_usd"] is None  # no price: no cost, never a default
            continue
        price = GPT_PRICE if call["model_profile"] == "gpt" else LOCAL_PRICE
        assert call["cost_usd"] == pytest.approx(expected_cost(call, price), abs=1e-9)
    assert calls[1]["cost_usd"] < calls[0]["cost_usd"]  # cached input is cheaper


def test_the_gateways_own_cache_repair_is_priced_with_its_profile(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    local = {**upstreams.profiles["local"], "server": {"cache_repair": True}}
    gw = start_gateway({"local": {**local, "price": LOCAL_PRICE}})
    gw.client().chat.completions.create(model="local", messages=HI)
    gw.settle()
    repairs = [c for c in gw.calls(repairs=True) if c["purpose"] == "cache_repair"]
    assert repairs and repairs[0]["status"] == "ok"
    assert repairs[0]["cost_usd"] == pytest.approx(expected_cost(repairs[0], LOCAL_PRICE), abs=1e-9)


# -- the refusal as callers see it


def test_a_call_over_a_daily_budget_is_a_429_naming_it_until_utc_midnight(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start(start_gateway, upstreams, [key("ci", {"max_tokens": 1, "per": "day"})])
    assert post(gw, "ci").status_code == 200  # nothing spent yet: 1 token left
    resp = post(gw, "ci")
    now = datetime.now(UTC)
    assert resp.status_code == 429
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"], error["param"]) == (
        "insufficient_quota",
        "budget_exceeded",
        None,
    )
    spent = gw.calls()[0]["prompt_tokens"] + gw.calls()[0]["completion_tokens"]
    assert error["message"].startswith(
        f"Budget exceeded: caller 'ci' has spent {spent} tokens of its max_tokens budget "
        "of 1 tokens per UTC day; 0 tokens left. The call was not sent. "
        "The daily budget renews at "
    )
    midnight = datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), UTC)
    assert abs(int(resp.headers["retry-after"]) - (midnight - now).total_seconds()) < 5
    assert resp.headers["x-should-retry"] == "false"
    [record] = refused(gw)
    assert (record["caller"], record["http_status"], record["attempts"]) == ("ci", 429, 0)
    assert record["cost_usd"] is None
    assert len(upstreams.openai.requests.bodies("/v1/chat/completions")) == 1


def test_a_lifetime_budget_sends_no_retry_after(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start(start_gateway, upstreams, [key("ci", {"max_tokens": 1, "per": "lifetime"})])
    post(gw, "ci")
    resp = post(gw, "ci")
    assert resp.status_code == 429
    assert "retry-after" not in resp.headers
    assert "for its lifetime" in resp.json()["error"]["message"]
    assert "does not renew" in resp.json()["error"]["message"]


@pytest.mark.parametrize("per", ["lifetime", "day"])
def test_the_openai_sdk_raises_rate_limit_error_once_without_retrying(
    upstreams: Upstreams, start_gateway: GatewayFactory, per: str
) -> None:
    """The SDK resends a 429 twice by default, after a Retry-After of up to two minutes;
    ``x-should-retry: false`` stops it, with no Retry-After (a lifetime budget) and with
    one it would wait out (a daily budget 30 s before midnight)."""
    gw = start(start_gateway, upstreams, [key("ci", {"max_tokens": 1, "per": per})])
    assert gw.app.budgets is not None
    before_midnight = datetime.combine(datetime.now(UTC).date(), time(23, 59, 30), UTC)
    gw.app.budgets.clock = lambda: before_midnight
    sdk = client(gw, "ci")  # the SDK's own retries left on
    assert sdk.max_retries == 2
    sdk.chat.completions.create(model="gpt", messages=HI)
    with pytest.raises(openai.RateLimitError) as caught:
        sdk.chat.completions.create(model="gpt", messages=HI)
    assert caught.value.status_code == 429 and caught.value.code == "budget_exceeded"
    assert caught.value.type == "insufficient_quota"
    assert "caller 'ci' has spent" in caught.value.message
    assert caught.value.response.headers.get("retry-after") == ("30" if per == "day" else None)
    with pytest.raises(openai.RateLimitError):
        sdk.chat.completions.create(model="gpt", messages=HI, stream=True)
    # each refused call reached the gateway once
    assert len(refused(gw)) == 2


def test_litellm_raises_its_rate_limit_error(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start(start_gateway, upstreams, [key("ci", {"max_tokens": 1, "per": "lifetime"})])
    post(gw, "ci")
    with pytest.raises(LiteLLMRateLimitError) as caught:
        litellm.completion(model="openai/gpt", api_base=gw.url + "/v1", api_key="ci", messages=HI)
    assert "budget_exceeded" in str(caught.value) or "Budget exceeded" in str(caught.value)
    assert len(refused(gw)) == 1


# -- each limit, the day boundary, the task budget


@pytest.mark.parametrize(
    ("budget", "limit"),
    [
        ({"max_tokens": 1}, "max_tokens"),
        ({"max_evaluated_tokens": 1}, "max_evaluated_tokens"),
        ({"max_cost_usd": 1e-9}, "max_cost_usd"),
    ],
)
def test_each_limit_kind_refuses_once_spent(
    upstreams: Upstreams, start_gateway: GatewayFactory, budget: dict[str, Any], limit: str
) -> None:
    upstreams.profiles["gpt"]["price"] = GPT_PRICE
    gw = start(start_gateway, upstreams, [key("ci", budget), key("free")])
    assert post(gw, "ci").status_code == 200
    resp = post(gw, "ci")
    assert resp.status_code == 429 and limit in resp.json()["error"]["message"]
    assert post(gw, "free").status_code == 200  # a key without a budget is not held


def test_a_daily_budget_is_spent_afresh_on_the_next_utc_day(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start(start_gateway, upstreams, [key("ci", {"max_tokens": 1, "per": "day"})])
    assert gw.app.budgets is not None
    post(gw, "ci")
    assert post(gw, "ci").status_code == 429
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    gw.app.budgets.clock = lambda: tomorrow
    assert post(gw, "ci").status_code == 200


def test_a_lifetime_budget_stays_spent_on_the_next_day(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start(start_gateway, upstreams, [key("ci", {"max_tokens": 1, "per": "lifetime"})])
    assert gw.app.budgets is not None
    post(gw, "ci")
    gw.app.budgets.clock = lambda: datetime.now(UTC) + timedelta(days=1)
    assert post(gw, "ci").status_code == 429


def test_a_task_budget_is_shared_by_every_caller_of_the_task(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start(
        start_gateway,
        upstreams,
        [key("alice"), key("bob")],
        budgets={"task": {"max_tokens": 60}},
    )
    served = 0
    while (resp := post(gw, "alice" if served % 2 else "bob", task="t1")).status_code == 200:
        served += 1
        assert served < 20
    assert served >= 2  # each caller spent from the same task
    message = resp.json()["error"]["message"]
    assert "task 't1' has spent" in message and "max_tokens budget of 60 tokens" in message
    assert post(gw, "alice", task="t1").status_code == 429
    assert post(gw, "bob", task="t2").status_code == 200
    callers = {c["caller"] for c in gw.calls() if c["task"] == "t1" and c["status"] == "ok"}
    assert callers == {"alice", "bob"}


# -- calls in flight


def test_a_call_in_flight_holds_what_is_left_and_bounds_what_is_spent(
    upstreams: Upstreams, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    """Four calls that start at once with 1 token of the budget left: the first holds it
    while it runs, so the three others are refused; once it ends, the next is refused
    too; the spending passes the limit by at most what the call spent beyond what it
    held (it gave no max_tokens: its reservation was no hard bound)."""
    data_dir = tmp_path / "gw"
    seed_ledger(data_dir, caller="ci", tokens=999)
    gw = start(start_gateway, upstreams, [key("ci", {"max_tokens": 1000})], data_dir=data_dir)
    upstreams.openai.queue(*[Reply(content="slow", delay_ms=1500) for _ in range(4)])
    statuses: list[int] = []
    threads = [
        threading.Thread(target=lambda: statuses.append(post(gw, "ci").status_code))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(statuses) == [200, 429, 429, 429]  # the one admitted is not cut
    held = "1 tokens held by calls in flight; 0 tokens left"
    assert all(held in c["error_message"] for c in refused(gw))
    assert post(gw, "ci").status_code == 429
    (served,) = [c for c in gw.calls() if c["status"] == "ok"]
    book = gw.app.budgets
    assert isinstance(book, BudgetBook)
    spent = book.spent(("caller", "ci"), "day", book.today()).tokens
    assert spent == 999 + served["prompt_tokens"] + served["completion_tokens"]
    assert book.reserved(("caller", "ci")).tokens == 0


def test_a_call_capped_by_max_tokens_is_admitted_only_where_all_it_may_spend_fits(
    upstreams: Upstreams, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    data_dir = tmp_path / "gw"
    seed_ledger(data_dir, caller="ci", tokens=0)
    gw = start(start_gateway, upstreams, [key("ci", {"max_tokens": 5000})], data_dir=data_dir)
    upstreams.openai.queue(Reply(content="fits"))
    # its prompt is bounded by its bytes and the template's 1,024 tokens
    assert post(gw, "ci", max_tokens=100).status_code == 200
    over = post(gw, "ci", max_tokens=4900)
    assert over.status_code == 429
    message = over.json()["error"]["message"]
    assert "this call may spend up to" in message and "lower max_tokens" in message


# -- a restart


def seed_ledger(data_dir: Path, caller: str | None, tokens: int, task: str = "default") -> None:
    """A ledger holding one call of today that spent ``tokens``."""
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    ledger = Ledger(data_dir / "ledger.db")
    ledger.open()
    try:
        ledger.insert(
            [
                CallRecord(
                    "call_seed", now, task, "agent_turn", "gpt", status="ok",
                    http_status=200, prompt_tokens=tokens, completion_tokens=0, caller=caller,
                )
            ]
        )  # fmt: skip
    finally:
        ledger.close()


def test_a_restarted_gateway_refuses_what_was_spent_before_it(
    upstreams: Upstreams, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    data_dir = tmp_path / "same"
    settings: dict[str, Any] = {
        "data_dir": data_dir,
        "budgets": {"task": {"max_tokens": 10_000, "per": "lifetime"}},
    }
    keys = [key("ci", {"max_tokens": 1, "per": "lifetime"}), key("ops")]
    first = start(start_gateway, upstreams, keys, **settings)
    assert post(first, "ci", task="t1").status_code == 200
    first.stop()

    second = start(start_gateway, upstreams, keys, **settings)
    resp = post(second, "ci", task="t2")
    assert resp.status_code == 429
    assert "caller 'ci' has spent" in resp.json()["error"]["message"]
    assert post(second, "ops", task="t1").status_code == 200
    assert isinstance(second.app.budgets, BudgetBook)
    t1 = second.app.budgets.spent(("task", "t1"), "lifetime", "")
    assert t1.tokens == sum(
        c["prompt_tokens"] + c["completion_tokens"]
        for c in second.calls()
        if c["task"] == "t1" and c["status"] == "ok"
    )


def test_a_restarted_serve_process_refuses_a_spent_task_and_the_cli_shows_it(
    tmp_path: Path,
) -> None:
    fake = FakeLlamaServer()
    with serve_in_thread(fake.app) as upstream:
        config = tmp_path / "gateway.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "data_dir": str(tmp_path / "data"),
                    "budgets": {"task": {"max_tokens": 5, "per": "lifetime"}},
                    "models": {
                        "local": {
                            "provider": "local",
                            "external_url": upstream.url,
                            "server": {"cache_repair": False},
                        }
                    },
                }
            )
        )

        def ask(port: int) -> httpx.Response:
            return httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                headers={"X-BoundedCode-Task": "spent"},
                json={"model": "local", "messages": HI},
                timeout=20,
            )

        for expected in (200, 429):
            port = free_port()
            proc = start_serve(config, port)
            try:
                assert ask(port).status_code == expected
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.communicate(timeout=30)
    out = run_cli("budgets", "--config", str(config))
    [row] = [line.split() for line in out.splitlines() if line.startswith("task")]
    served = [c for c in read_calls(tmp_path / "data" / "calls.jsonl") if c["status"] == "ok"]
    tokens = served[0]["prompt_tokens"] + served[0]["completion_tokens"]
    assert row[:4] == ["task", "spent", "lifetime", "max_tokens"]
    # spent, held by calls in flight (none), allowed, left
    assert row[4:] == [f"{tokens:,}", "0", "5", "0"]


def run_cli(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "boundedcode_gateway", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
