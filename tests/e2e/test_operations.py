"""``GET /metrics`` counts what the ledger holds; ``GET /ready`` says which profiles can take
calls and why the others cannot."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from boundedcode_gateway.metering.records import CallRecord
from tests.e2e.conftest import OPENAI_KEY, Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply

P = "boundedcode_gateway_"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(gw: Gateway, key: str | None = None) -> Samples:
    """``/metrics``, with an admin ``key`` where the gateway has ``auth:``."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    resp = httpx.get(gw.url + "/metrics", headers=headers, timeout=10)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def by_name(found: Samples, name: str, label: str) -> dict[str, float]:
    """One metric's values summed by one label."""
    out: dict[str, float] = {}
    for (sample, labels), value in found.items():
        if sample == name:
            key = dict(labels)[label]
            out[key] = out.get(key, 0.0) + value
    return out


def submit_on_loop(gw: Gateway, record: CallRecord) -> None:
    """Publish a record as the gateway's own code does: on its event loop."""
    loop = gw.app.loop
    assert loop is not None

    async def submit() -> None:
        gw.app.bus.publish(record)

    asyncio.run_coroutine_threadsafe(submit(), loop).result(10)


def priced(call_id: str, model: str, cost: float) -> CallRecord:
    return CallRecord(
        call_id=call_id,
        started_at="2025-01-01T00:00:00.000Z",
        task="priced-task",
        purpose="planner",
        model_profile=model,
        status="ok",
        http_status=200,
        total_ms=12.0,
        prompt_tokens=5,
        completion_tokens=2,
        cost_usd=cost,
    )


def make_known_mix(gw: Gateway, ups: Upstreams) -> None:
    """Calls that end in each way: whole and streamed answers, errors of two kinds, a
    call resent after a 503, a stream that broke and was sent again."""
    client = gw.client(task="mix-1")
    ask: Any = [{"role": "user", "content": "Name three colours."}]
    client.chat.completions.create(model="local", messages=ask)
    stream = client.chat.completions.create(
        model="gpt", messages=ask, stream=True, stream_options={"include_usage": True}
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-profile", messages=ask)
    ups.compat.queue(Reply(status=400))
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="glm", messages=ask)
    ups.openai.queue(Reply(status=503, headers={"retry-after": "0"}), Reply(content="second"))
    second = client.chat.completions.create(model="gpt", messages=ask)
    assert second.choices[0].message.content == "second"
    # broken before any content: sent again, and the caller sees one answer
    ups.other_local.queue(Reply(content="a b c", break_after_chunks=0), Reply(content="a b c"))
    again = client.chat.completions.create(model="other", messages=ask, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in again if c.choices) == "a b c"


def test_metrics_count_what_the_ledger_holds(gateway: Gateway, upstreams: Upstreams) -> None:
    make_known_mix(gateway, upstreams)
    submit_on_loop(gateway, priced("call_priced_1", "gpt", 0.125))
    submit_on_loop(gateway, priced("call_priced_2", "gpt", 0.5))
    submit_on_loop(gateway, priced("call_priced_3", "local", 0.25))
    rows = gateway.ledger_rows(repairs=True)
    calls = gateway.calls(repairs=True)
    found = scrape(gateway)
    profiles = {"local", "other", "gpt", "glm"}

    def model_of(row: dict[str, Any]) -> str:
        return row["model_profile"] if row["model_profile"] in profiles else "other"

    ledger = Counter(
        (model_of(r), r["purpose"], str(r["http_status"]), r["error_code"] or "") for r in rows
    )
    metric = Counter(
        {
            (labels["model"], labels["purpose"], labels["status"], labels["code"]): int(value)
            for (name, label_set), value in found.items()
            if name == P + "requests_total"
            for labels in [dict(label_set)]
        }
    )
    assert metric == ledger
    assert ("other", "agent_turn", "404", "model_not_found") in ledger
    assert sum(1 for r in rows if r["status"] == "error") == 2
    assert "mix-1" not in str(found) and "no-such-profile" not in str(found)

    durations = by_name(found, P + "request_duration_seconds_count", "model")
    assert sum(durations.values()) == len(rows)
    ttft = by_name(found, P + "time_to_first_token_seconds_count", "model")
    assert sum(ttft.values()) == sum(1 for r in rows if r["ttft_ms"] is not None)
    tokens = by_name(found, P + "tokens_total", "kind")
    for kind in ("prompt", "cached", "evaluated", "completion"):
        assert tokens.get(kind, 0) == sum(r[f"{kind}_tokens"] or 0 for r in rows), kind
    assert tokens["prompt"] > 0 and tokens["completion"] > 0
    cost = by_name(found, P + "cost_usd_total", "model")
    for model in profiles:
        spent = sum(r["cost_usd"] or 0.0 for r in rows if r["model_profile"] == model)
        assert cost.get(model, 0.0) == spent, model
    assert (cost["gpt"], cost["local"]) == (0.625, 0.25)
    retried = by_name(found, P + "retried_requests_total", "model")
    assert retried == {
        m: float(sum(1 for r in rows if model_of(r) == m and r["retried"])) for m in retried
    }
    assert retried["other"] == 1
    # each send after a call's first, by what ended the one before (the call log's detail)
    causes = Counter(a["code"] for c in calls for a in c["attempt_log"][:-1])
    resends = by_name(found, P + "resends_total", "cause")
    assert resends == {cause: float(n) for cause, n in causes.items()}
    assert set(resends) == {"upstream_unavailable", "upstream_stream_broken"}
    in_flight = by_name(found, P + "requests_in_flight", "model")
    assert in_flight == {"local": 0, "other": 0, "gpt": 0, "glm": 0}
    assert found[(P + "metering_dropped_records_total", frozenset())] == 0
    assert found[(P + "metering_written_records_total", frozenset())] == len(rows)


def test_ready_when_every_profile_can_take_calls(gateway: Gateway) -> None:
    resp = httpx.get(gateway.url + "/ready", timeout=10)
    assert resp.status_code == 200
    assert resp.json() == {
        "status": "ready",
        "models": {name: {"ready": True} for name in ("local", "other", "gpt", "glm")},
    }


def test_not_ready_names_the_missing_key_and_keeps_it_secret(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TEST_OPENAI_KEY")
    resp = httpx.get(gateway.url + "/ready", timeout=10)
    assert resp.status_code == 503
    body = resp.json()
    assert body["status"] == "not_ready"
    assert body["models"]["gpt"] == {
        "ready": False,
        "reason": "the environment variable TEST_OPENAI_KEY is not set",
    }
    assert all(body["models"][n]["ready"] for n in ("local", "other", "glm"))
    assert OPENAI_KEY not in resp.text


def test_not_ready_while_an_external_server_is_down(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket is closed
    dead = {"provider": "local", "external_url": f"http://127.0.0.1:{port}"}
    gw = start_gateway({**upstreams.profiles, "dead": dead})
    resp = httpx.get(gw.url + "/ready", timeout=10)
    assert resp.status_code == 503
    models = resp.json()["models"]
    assert models["dead"]["ready"] is False
    assert models["dead"]["reason"].startswith(
        f"the server at http://127.0.0.1:{port} cannot be reached"
    )
    assert models["local"] == {"ready": True}
    # the calls to it are still answered, and the liveness check is unaffected
    with pytest.raises(openai.APIStatusError) as info:
        gw.client().chat.completions.create(
            model="dead", messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.status_code == 503
    assert httpx.get(gw.url + "/health", timeout=10).status_code == 200


def test_a_readiness_check_that_fails_is_a_reason(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken() -> str | None:
        raise RuntimeError("a bug in a check")

    monkeypatch.setattr(gateway.app.upstreams["glm"], "readiness", broken)
    resp = httpx.get(gateway.url + "/ready", timeout=10)
    assert resp.status_code == 503
    reason = "its readiness check failed (see the gateway's log)"
    assert resp.json()["models"]["glm"] == {"ready": False, "reason": reason}
