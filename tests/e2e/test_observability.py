"""Calls exported over OTLP to a real receiver (Arize Phoenix, started on 127.0.0.1) and
read back from it: each kind of call arrives as the spans docs/observability.md lists,
in the caller's trace; content only when configured; a receiver that is down or hangs
never holds a call up nor loses its record."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from boundedcode_gateway.config import parse_config
from boundedcode_gateway.unique_ids import hex_id
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply
from tests.fakes.otlp_metrics import OtlpMetrics
from tests.receivers.phoenix import Phoenix

# each module starts its own Phoenix, which takes up to half a minute on a busy machine
pytestmark = pytest.mark.timeout(300)

ASK = [{"role": "user", "content": "Tell me about the sea."}]
ANSWER = "The sea covers most of the planet and holds most of its water."


@pytest.fixture(scope="module")
def phoenix() -> Iterator[Phoenix]:
    with Phoenix() as receiver:
        yield receiver


def traced(
    start_gateway: GatewayFactory,
    profiles: dict[str, Any],
    endpoint: str,
    **observability: Any,
) -> Gateway:
    settings = {"endpoint": endpoint, "metrics": False, **observability}
    return start_gateway(profiles, observability=settings)


def caller_trace() -> tuple[str, str, dict[str, str]]:
    """A caller's trace id, span id and the traceparent header naming them."""
    trace_id, span_id = hex_id(128), hex_id(64)
    return trace_id, span_id, {"traceparent": f"00-{trace_id}-{span_id}-01"}


def post(
    gw: Gateway, headers: dict[str, str], stream: bool = False, **extra: Any
) -> httpx.Response:
    body = {"model": "local", "messages": ASK, "stream": stream, **extra}
    resp = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    return resp


def exported(gw: Gateway) -> None:
    """Every record so far handed to the receiver."""
    assert gw.app.bus.flush(10.0)
    export = gw.app.observability.export
    assert export is not None and export.flush(10.0)


def by_name(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in spans}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_call_is_a_span_of_the_callers_trace(
    phoenix: Phoenix,
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    stream: bool,
) -> None:
    gw = traced(start_gateway, upstreams.profiles, phoenix.otlp_http_endpoint)
    trace_id, parent, headers = caller_trace()
    upstreams.llama.queue(Reply(content=ANSWER))
    resp = post(gw, {**headers, "X-BoundedCode-Task": "sea"}, stream=stream)
    assert resp.status_code == 200
    exported(gw)
    # sent once: the call's span alone, the upstream's work its child
    [call] = phoenix.spans(trace_id=trace_id, wait_for=1)
    assert call["name"] == "chat local" and call["parent_span_id"] == parent
    a = call["attributes"]
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "llama.cpp"
    assert a["gen_ai.request.model"] == "local"
    assert a["gen_ai.request.stream"] is stream
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert a["boundedcode.task"] == "sea" and a["boundedcode.front"] == "chat"
    assert isinstance(a["boundedcode.evaluated_tokens"], int)
    assert a["boundedcode.miss_cause"] == "first_call"
    assert a["server.address"] == "127.0.0.1" and isinstance(a["server.port"], int)
    assert ("gen_ai.response.time_to_first_chunk" in a) is stream
    assert not any(k.startswith(("gen_ai.input", "gen_ai.output")) for k in a)
    # the upstream was sent the call's span as its parent
    [sent] = [r for r in upstreams.llama.requests if r.method == "POST"]
    assert sent.headers["traceparent"] == f"00-{trace_id}-{call['span_id']}-01"
    call_log = gw.calls()[-1]
    assert call_log["trace"]["trace_id"] == trace_id


def test_a_resend_after_a_break_and_a_continuation_are_attempts_of_the_call(
    phoenix: Phoenix, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = traced(start_gateway, upstreams.profiles, phoenix.otlp_http_endpoint)
    # a break before any content is sent again; one after text is continued
    upstreams.llama.queue(
        Reply(content=ANSWER, break_after_chunks=2),
        Reply(content=ANSWER, break_after_chunks=7),
        Reply(content=ANSWER),
    )
    trace_id, _, headers = caller_trace()
    assert post(gw, headers, stream=True).status_code == 200
    exported(gw)
    spans = phoenix.spans(trace_id=trace_id, wait_for=4)
    call = by_name(spans)["chat local"]
    attempts = [s for s in spans if " attempt " in s["name"]]
    kinds = [s["attributes"]["boundedcode.attempt.kind"] for s in attempts]
    assert kinds == ["first", "resend", "continuation"]
    assert all(s["parent_span_id"] == call["span_id"] for s in attempts)
    assert attempts[0]["status_code"] == "ERROR"
    assert attempts[0]["attributes"]["error.type"] == "upstream_stream_broken"
    assert call["attributes"]["boundedcode.retried"] is True
    assert call["attributes"]["boundedcode.attempts"] == 3
    assert call["status_code"] != "ERROR"
    # each request upstream named the call's span
    sent = [r.headers["traceparent"] for r in upstreams.llama.requests if r.method == "POST"]
    assert sent == [f"00-{trace_id}-{call['span_id']}-01"] * 3


def test_the_cache_repair_is_a_child_of_the_call_it_follows(
    phoenix: Phoenix, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    profile = {**upstreams.profiles["local"], "server": {"cache_repair": True}}
    gw = traced(start_gateway, {"local": profile}, phoenix.otlp_http_endpoint)
    split = (
        "It doubles the table when resizing, then moves every entry into its new bucket, "
        "one after another, in the order of the old buckets."
    )
    upstreams.llama.queue(Reply(content=split, reasoning_content="Think about it first."))
    trace_id, _, headers = caller_trace()
    assert post(gw, {**headers, "X-BoundedCode-Task": "repaired"}).status_code == 200
    gw.settle()
    assert [c["purpose"] for c in gw.calls(repairs=True)].count("cache_repair") >= 1
    exported(gw)
    spans = phoenix.spans(trace_id=trace_id, wait_for=2)
    call = by_name(spans)["chat local"]
    repair = by_name(spans)["cache_repair local"]
    assert repair["parent_span_id"] == call["span_id"]
    assert repair["attributes"]["boundedcode.purpose"] == "cache_repair"
    assert repair["attributes"]["gen_ai.operation.name"] == "text_completion"
    assert isinstance(repair["attributes"]["boundedcode.evaluated_tokens"], int)


def test_a_call_refused_by_its_budget_is_an_error_span(
    phoenix: Phoenix, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(
        upstreams.profiles,
        observability={"endpoint": phoenix.otlp_http_endpoint, "metrics": False},
        budgets={"task": {"max_tokens": 10}},
    )
    upstreams.llama.queue(Reply(content=ANSWER))
    # the first call spends the task's tokens; the next is refused before it is sent
    assert post(gw, {"X-BoundedCode-Task": "spent"}).status_code == 200
    sent = len(upstreams.llama.requests)
    trace_id, parent, headers = caller_trace()
    resp = post(gw, {**headers, "X-BoundedCode-Task": "spent"})
    assert resp.status_code == 429
    exported(gw)
    [span] = phoenix.spans(trace_id=trace_id, wait_for=1)
    assert span["name"] == "chat local" and span["parent_span_id"] == parent
    assert span["status_code"] == "ERROR" and "budget" in span["status_message"]
    a = span["attributes"]
    assert a["error.type"] == "budget_exceeded" and a["http.response.status_code"] == 429
    assert a["boundedcode.budget_holder"] == "task:spent"
    assert len(upstreams.llama.requests) == sent


def test_content_is_exported_only_when_configured_and_cut_to_its_bound(
    phoenix: Phoenix, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = traced(
        start_gateway,
        upstreams.profiles,
        phoenix.otlp_http_endpoint,
        capture_content=True,
        content_max_chars=40,
    )
    upstreams.llama.queue(Reply(content=ANSWER))
    trace_id, _, headers = caller_trace()
    assert post(gw, headers, stream=True).status_code == 200
    exported(gw)
    spans = phoenix.spans(trace_id=trace_id, wait_for=1)
    a = by_name(spans)["chat local"]["attributes"]
    whole = '[{"role":"user","parts":[{"type":"text","content":"Tell me about the sea."}]}]'
    assert a["gen_ai.input.messages"] == whole[:40] + "…[truncated]"
    assert a["gen_ai.output.messages"].startswith('[{"role":"assistant"')
    # the call log and the ledger hold no content, whatever the export does
    line = str(gw.calls()[-1])
    assert "Tell me about the sea" not in line and ANSWER not in line


class Hung:
    """A collector that takes connections and never answers them."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.held.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
        for conn in self.held:
            conn.close()


def closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("receiver", ["down", "hung"])
def test_a_receiver_down_or_hung_holds_up_no_call_and_loses_no_record(
    upstreams: Upstreams, start_gateway: GatewayFactory, receiver: str
) -> None:
    hung = Hung() if receiver == "hung" else None
    port = hung.port if hung is not None else closed_port()
    try:
        gw = start_gateway(
            upstreams.profiles,
            observability={
                "endpoint": f"http://127.0.0.1:{port}",
                "metrics_interval_s": 0.5,
                "export_timeout_s": 30,
                "queue_calls": 4,
            },
        )
        started = time.monotonic()
        for _ in range(12):
            upstreams.llama.queue(Reply(content="ok"))
            assert post(gw, {}).status_code == 200
        took = time.monotonic() - started
        # the export waits up to 30 s on its collector; the calls waited on none of it
        assert took < 15.0, took
        calls = gw.calls()
        assert len(calls) == 12 and all(c["status"] == "ok" for c in calls)
        assert len(gw.ledger_rows()) == 12
        export = gw.app.observability.export
        assert export is not None
        deadline = time.monotonic() + 20
        while export.dropped + export.failed == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert export.exported == 0 and export.dropped + export.failed > 0
        metrics = httpx.get(gw.url + "/metrics", timeout=10).text
        assert "boundedcode_gateway_otlp_calls_dropped_total" in metrics
    finally:
        if hung is not None:
            hung.close()


def test_metrics_go_over_otlp_with_the_genai_names_and_the_gateways_counters(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    collector = OtlpMetrics()
    try:
        gw = start_gateway(
            upstreams.profiles,
            observability={"endpoint": collector.url, "metrics_interval_s": 0.2},
        )
        upstreams.llama.queue(Reply(content=ANSWER), Reply(content=ANSWER))
        assert post(gw, {}).status_code == 200
        assert post(gw, {}, stream=True).status_code == 200
        exported(gw)
        usage = collector.points("gen_ai.client.token.usage")
        kinds = {a["gen_ai.token.type"] for a, _ in usage}
        assert kinds == {"input", "output"}
        assert all(a["gen_ai.provider.name"] == "llama.cpp" for a, _ in usage)
        [(attributes, (count, _))] = [
            p for p in collector.points("gen_ai.client.operation.duration") if p[1][0] == 2
        ][-1:]
        assert attributes["gen_ai.request.model"] == "local" and count == 2
        first = collector.points("gen_ai.client.inference.time_to_first_chunk")
        assert first and first[-1][1][0] == 1  # the streamed call alone
        evaluated = collector.points("boundedcode.usage.evaluated_tokens")
        assert evaluated and evaluated[-1][1] > 0
        # the Prometheus counters /metrics serves, the same numbers
        requests = collector.points("boundedcode_gateway_requests")
        assert sum(v for a, v in requests if a.get("status") == "200") >= 2
    finally:
        collector.close()


def test_the_standard_environment_alone_exports_over_grpc(
    phoenix: Phoenix,
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no observability: block at all, as an operator's usual set-up
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix.otlp_grpc_endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-under-test")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "openinference.project.name=by-env")
    gw = start_gateway(upstreams.profiles)
    upstreams.llama.queue(Reply(content=ANSWER))
    trace_id, parent, headers = caller_trace()
    assert post(gw, headers).status_code == 200
    exported(gw)
    spans = phoenix.spans(project="by-env", trace_id=trace_id, wait_for=1)
    assert by_name(spans)["chat local"]["parent_span_id"] == parent


def test_a_reload_turns_the_export_on_for_the_calls_after_it(
    phoenix: Phoenix, upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(upstreams.profiles)
    assert gw.app.observability.export is None
    upstreams.llama.queue(Reply(content=ANSWER), Reply(content=ANSWER))
    before, _, headers = caller_trace()
    assert post(gw, headers).status_code == 200
    text = yaml.safe_dump(
        {
            "data_dir": str(gw.data_dir),
            "observability": {"endpoint": phoenix.otlp_http_endpoint, "metrics": False},
            "models": upstreams.profiles,
        }
    )
    loop = gw.app.loop
    assert loop is not None
    result = asyncio.run_coroutine_threadsafe(gw.app.reload(parse_config(text)), loop).result(60)
    assert result.applied
    after, _, headers = caller_trace()
    assert post(gw, headers).status_code == 200
    exported(gw)
    assert by_name(phoenix.spans(trace_id=after, wait_for=1))["chat local"]
    assert phoenix.spans(trace_id=before) == []
    # the upstream heard of the trace only once it was exported
    sent = [r.headers.get("traceparent") for r in upstreams.llama.requests if r.method == "POST"]
    assert sent[0] is None and sent[1] is not None and after in sent[1]
