"""``operations/metrics.py``: each record counted once into the gateway's own registry, with
bounded label values; the states read when scraped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from boundedcode_gateway.config import parse_config
from boundedcode_gateway.live_config import Route, build_live_config
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.metering.writer import MeterWriter
from boundedcode_gateway.operations.metrics import MAX_CODES, GatewayMetrics
from boundedcode_gateway.upstream.http import HttpClient, Timeouts

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Table:
    """The routes a test gives the metrics."""

    def __init__(self, routes: list[Route]) -> None:
        self.list = routes

    def routes(self) -> Iterator[Route]:
        yield from self.list

    def serves(self, model: str) -> bool:
        return any(r.name == model for r in self.list)


@pytest.fixture
def table() -> Table:
    text = yaml.safe_dump(
        {
            "data_dir": "unused",
            "models": {
                "local": {"provider": "local", "external_url": "http://127.0.0.1:9"},
                "gpt": {"provider": "openai", "api_key_env": "K"},
            },
        }
    )
    live = build_live_config(parse_config(text), HttpClient(Timeouts(1.0, 1.0)))
    return Table(list(live.routes.values()))


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[MeterWriter]:
    w = MeterWriter(tmp_path / "calls.jsonl", tmp_path / "ledger.db", max_queue=2)
    yield w
    w.close()


def samples(metrics: GatewayMetrics) -> Samples:
    body, content_type = metrics.exposition()
    assert content_type.startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def record(**fields: Any) -> CallRecord:
    base: dict[str, Any] = {
        "call_id": "call_1",
        "started_at": "2025-01-01T00:00:00.000Z",
        "task": "task-secret-id",
        "purpose": "agent_turn",
        "model_profile": "local",
        "status": "ok",
        "http_status": 200,
        "total_ms": 1500.0,
        "attempt_log": [{"status": 200, "code": None}],
    }
    return CallRecord(**{**base, **fields})


P = "boundedcode_gateway_"


def test_each_record_is_counted_once_by_its_outcome(table: Table, writer: MeterWriter) -> None:
    metrics = GatewayMetrics(table, writer)
    metrics.observe(
        record(
            ttft_ms=250.0,
            prompt_tokens=100,
            cached_tokens=60,
            evaluated_tokens=40,
            completion_tokens=7,
        )
    )
    metrics.observe(record(ttft_ms=50.0, prompt_tokens=10, completion_tokens=3, stream=True))
    metrics.observe(
        record(
            model_profile="gpt",
            status="error",
            http_status=502,
            error_code="upstream_stream_broken",
            retried=True,
            attempt_log=[
                {"status": 503, "code": "upstream_unavailable"},
                {"status": 500, "code": None},
                {"status": 502, "code": "upstream_stream_broken"},
                {"status": 502, "code": "upstream_stream_broken"},
            ],
            cost_usd=0.25,
        )
    )
    metrics.observe(record(model_profile="gpt", cost_usd=0.5, purpose="condenser"))
    found = samples(metrics)
    ok = {"model": "local", "purpose": "agent_turn", "status": "200", "code": ""}
    assert value(found, P + "requests_total", **ok) == 2
    broken = {"model": "gpt", "purpose": "agent_turn", "status": "502"}
    assert value(found, P + "requests_total", **broken, code="upstream_stream_broken") == 1
    local = {"model": "local", "purpose": "agent_turn"}
    assert value(found, P + "request_duration_seconds_count", **local) == 2
    assert value(found, P + "request_duration_seconds_sum", **local) == 3.0
    assert value(found, P + "time_to_first_token_seconds_count", **local) == 2
    assert value(found, P + "time_to_first_token_seconds_bucket", **local, le="0.1") == 1
    assert value(found, P + "tokens_total", **local, kind="prompt") == 110
    assert value(found, P + "tokens_total", **local, kind="cached") == 60
    assert value(found, P + "tokens_total", **local, kind="evaluated") == 40
    assert value(found, P + "tokens_total", **local, kind="completion") == 10
    assert value(found, P + "cost_usd_total", model="gpt", purpose="agent_turn") == 0.25
    assert value(found, P + "cost_usd_total", model="gpt", purpose="condenser") == 0.5
    assert value(found, P + "cost_usd_total", **local) == 0
    assert value(found, P + "retried_requests_total", model="gpt", purpose="agent_turn") == 1
    assert value(found, P + "retried_requests_total", **local) == 0
    # three sends after the first, each by what ended the one before it
    resends = {
        labels["cause"]: v
        for (name, label_set), v in found.items()
        if name == P + "resends_total"
        for labels in [dict(label_set)]
    }
    assert resends == {"upstream_unavailable": 1, "http_500": 1, "upstream_stream_broken": 1}


def test_label_values_are_bounded(table: Table, writer: MeterWriter) -> None:
    metrics = GatewayMetrics(table, writer)
    unknown = {"status": "error", "http_status": 404, "error_code": "model_not_found"}
    metrics.observe(record(model_profile="made-up-by-a-caller", **unknown))
    metrics.observe(record(purpose="my_own_purpose"))
    metrics.observe(record(purpose="cache_repair"))
    for n in range(MAX_CODES + 5):
        metrics.observe(record(status="error", http_status=502, error_code=f"code_{n}"))
    metrics.observe(record(status="error", http_status=502, error_code="Not A Code!"))
    body = metrics.exposition()[0].decode()
    found = samples(metrics)
    assert "made-up-by-a-caller" not in body and "task-secret-id" not in body
    assert "my_own_purpose" not in body and "Not A Code" not in body
    missing = {"model": "other", "purpose": "agent_turn", "status": "404"}
    assert value(found, P + "requests_total", **missing, code="model_not_found") == 1
    assert value(found, P + "request_duration_seconds_count", model="local", purpose="other") == 1
    repairs = {"model": "local", "purpose": "cache_repair"}
    assert value(found, P + "request_duration_seconds_count", **repairs) == 1
    codes = {
        dict(labels)["code"]
        for (name, labels) in found
        if name == P + "requests_total" and dict(labels)["status"] == "502"
    }
    # model_not_found took the first of the MAX_CODES places, code_0… the rest
    assert codes == {f"code_{n}" for n in range(MAX_CODES - 1)} | {"other"}
    other = {"model": "local", "purpose": "agent_turn", "status": "502", "code": "other"}
    assert value(found, P + "requests_total", **other) == 6 + 1


def test_states_are_read_when_scraped(
    table: Table, writer: MeterWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = GatewayMetrics(table, writer)
    local = next(r for r in table.list if r.name == "local")
    local.enter()
    local.enter()
    monkeypatch.setattr(local.fleet, "restarts", lambda: 3)
    for n in range(3):  # the writer is not started: two wait, the third is dropped
        writer.submit(record(call_id=f"call_{n}"))
    found = samples(metrics)
    assert value(found, P + "requests_in_flight", model="local") == 2
    assert value(found, P + "requests_in_flight", model="gpt") == 0
    assert value(found, P + "llama_server_restarts_total", model="local") == 3
    assert (P + "llama_server_restarts_total", frozenset({("model", "gpt")})) not in found
    assert value(found, P + "metering_queue_depth") == 2
    assert value(found, P + "metering_dropped_records_total") == 1
    local.leave()
    writer.start()
    assert writer.flush(5.0)
    found = samples(metrics)
    assert value(found, P + "requests_in_flight", model="local") == 1
    assert value(found, P + "metering_queue_depth") == 0
    assert value(found, P + "metering_written_records_total") == 2
    # an SQLite ledger keeps nothing back (tests/postgres/test_pg_outage.py: one that does)
    assert value(found, P + "metering_ledger_buffered_records") == 0
    assert value(found, P + "metering_ledger_dropped_records_total") == 0


def test_two_gateways_in_one_process_count_apart(table: Table, writer: MeterWriter) -> None:
    first, second = GatewayMetrics(table, writer), GatewayMetrics(table, writer)
    first.observe(record())
    ok = {"model": "local", "purpose": "agent_turn", "status": "200", "code": ""}
    assert value(samples(first), P + "requests_total", **ok) == 1
    assert value(samples(second), P + "requests_total", **ok) == 0
    second.reloaded(applied=False)
    assert value(samples(second), P + "config_reloads_total", result="refused") == 1
    assert value(samples(first), P + "config_reloads_total", result="refused") == 0
