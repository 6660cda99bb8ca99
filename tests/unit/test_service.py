"""``service.py``: the pipeline from a validated request to its answer and its one record,
against a scripted server behind the OpenAI adapter."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.config import parse_config
from boundedcode_gateway.errors import GatewayError, InternalError, ModelNotFound, StreamBroken
from boundedcode_gateway.live_config import LiveConfig, Route
from boundedcode_gateway.metering.meter import CLIENT_CLOSED
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.policy import structured
from boundedcode_gateway.providers.registry import REASONING_FILES
from boundedcode_gateway.reasoning_store.store import ReasoningStore
from boundedcode_gateway.service import GatewayService, JsonAnswer, StreamAnswer
from boundedcode_gateway.upstream.http import HttpClient, Timeouts
from tests.unit.scripted_http import (
    DONE,
    FINISH,
    ROLE,
    Answer,
    RecordingWriter,
    ScriptedServer,
    chunked,
    completion,
    head,
    json_answer,
    openai_upstream,
    text_chunks,
)

ASK: list[Any] = [{"role": "user", "content": "hi"}]
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
    },
}


@dataclass
class Pipeline:
    service: GatewayService
    server: ScriptedServer
    writer: RecordingWriter
    http: HttpClient

    async def chat(self, **body: Any) -> JsonAnswer | StreamAnswer:
        ctx = CallContext.new("t", "agent_turn")
        return await self.service.chat(ctx, {"model": "gpt", "messages": ASK, **body})

    @property
    def record(self) -> CallRecord:
        [record] = self.writer.records
        return record

    def sent(self) -> list[Any]:
        return [orjson.loads(s.body) for s in self.server.seen]


@pytest.fixture
async def pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Pipeline]:
    server = ScriptedServer()
    await server.start()
    http = HttpClient(Timeouts(connect_s=5.0, read_s=5.0))
    writer = RecordingWriter()
    upstream = openai_upstream(server.url, http, monkeypatch)
    config = parse_config(
        f"data_dir: {tmp_path}\nmodels: {{gpt: {{provider: local, external_url: {server.url}}}}}"
    )
    live = LiveConfig(config, {"gpt": Route("gpt", upstream, ())})
    service = GatewayService(live, http, writer, ReasoningStore(tmp_path, REASONING_FILES))
    yield Pipeline(service, server, writer, http)
    await service.close()
    await http.close()
    await server.stop()


async def test_a_whole_answer_is_relayed_and_recorded_once(pipeline: Pipeline) -> None:
    pipeline.server.queue(json_answer(200, completion("fine")))
    answer = await pipeline.chat()
    assert isinstance(answer, JsonAnswer) and answer.status == 200
    assert orjson.loads(answer.body)["choices"][0]["message"]["content"] == "fine"
    record = pipeline.record
    assert (record.status, record.http_status, record.attempts) == ("ok", 200, 1)
    assert record.provider == "openai" and record.upstream_model == "gpt-5.1"
    assert (record.prompt_tokens, record.completion_tokens) == (3, 2)


async def test_an_unknown_model_is_a_404_recorded_once(pipeline: Pipeline) -> None:
    with pytest.raises(ModelNotFound):
        await pipeline.chat(model="nobody")
    record = pipeline.record
    assert (record.status, record.http_status, record.error_code) == (
        "error",
        404,
        "model_not_found",
    )
    assert record.model_profile == "nobody" and pipeline.server.seen == []


async def test_a_whole_answer_cut_twice_is_raised_and_recorded_once(pipeline: Pipeline) -> None:
    body = orjson.dumps(completion("fine"))
    cut = Answer([head(200, {"Content-Length": str(len(body))}), body[:20]], "close")
    pipeline.server.queue(cut, cut)
    with pytest.raises(StreamBroken):
        await pipeline.chat()
    record = pipeline.record
    assert (record.http_status, record.error_code) == (502, "upstream_stream_broken")
    assert record.retried is True and record.attempts == 2


async def test_a_fault_inside_the_gateway_is_an_internal_error_recorded_once(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = pipeline.service.upstreams["gpt"]

    def broken_prepare(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug with a secret in its text")

    monkeypatch.setattr(upstream, "prepare", broken_prepare)
    with pytest.raises(InternalError) as info:
        await pipeline.chat()
    assert "secret" not in info.value.message  # the caller is told where to look, not what
    assert pipeline.record.error_code == "internal_error"


async def test_a_cancelled_call_is_recorded_as_the_caller_gone(pipeline: Pipeline) -> None:
    pipeline.server.queue(Answer([], "hold"))
    call = asyncio.ensure_future(pipeline.chat())
    for _ in range(1000):  # until the request is upstream (bounded)
        if pipeline.server.seen:
            break
        await asyncio.sleep(0.005)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    record = pipeline.record
    assert (record.http_status, record.error_code) == (CLIENT_CLOSED, "client_disconnected")
    await asyncio.wait_for(pipeline.server.client_left.wait(), 5)


async def test_a_stream_is_answered_through_its_relay_and_recorded_at_its_end(
    pipeline: Pipeline,
) -> None:
    events = [ROLE, *text_chunks("one", " two"), FINISH, DONE]
    pipeline.server.queue(chunked(200, events, {"Content-Type": "text/event-stream"}))
    answer = await pipeline.chat(stream=True, stream_options={"boundedcode_discard": True})
    assert isinstance(answer, StreamAnswer)
    assert b'"one"' in answer.first
    assert pipeline.writer.records == []  # not yet: the stream is not over
    rest = b"".join([piece async for piece in answer.relay.chunks()])
    assert rest.endswith(b"data: [DONE]\n\n")
    assert pipeline.record.status == "ok" and pipeline.record.stream is True
    # the caller's declaration is the gateway's, never the upstream's
    [sent] = pipeline.sent()
    assert sent["stream_options"] == {"include_usage": True}


async def test_a_refused_schema_is_dropped_once_and_then_never_sent(pipeline: Pipeline) -> None:
    refusal = {
        "error": {
            "message": "Invalid parameter: 'response_format' 'json_schema' is not supported",
            "type": "invalid_request_error",
            "param": "response_format",
            "code": None,
        }
    }
    pipeline.server.queue(
        json_answer(400, refusal),
        json_answer(200, completion('{"n": 1}')),
        json_answer(200, completion('{"n": 2}')),
    )
    await pipeline.chat(response_format=SCHEMA)
    await pipeline.chat(response_format=SCHEMA)
    first, second = pipeline.writer.records
    assert first.structured_output == structured.DROPPED_AFTER_REJECTION
    assert second.structured_output == structured.SKIPPED_KNOWN_REJECTION
    sent = pipeline.sent()
    assert "response_format" in sent[0]
    assert all("response_format" not in body for body in sent[1:])
    assert first.status == second.status == "ok"


async def test_a_changed_profile_is_sent_a_schema_its_old_upstream_refused(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    refusal = {"error": {"message": "'response_format' is not supported", "code": None}}
    pipeline.server.queue(json_answer(400, refusal), json_answer(200, completion('{"n": 1}')))
    await pipeline.chat(response_format=SCHEMA)
    old = pipeline.service.live
    changed = openai_upstream(pipeline.server.url, pipeline.http, monkeypatch, model="gpt-5.2")
    pipeline.service.use(LiveConfig(old.config, {"gpt": Route("gpt", changed, ("new",))}))
    pipeline.server.queue(json_answer(200, completion('{"n": 2}')))
    await pipeline.chat(response_format=SCHEMA)
    sent = pipeline.sent()[-1]
    assert sent["model"] == "gpt-5.2" and "response_format" in sent
    assert pipeline.writer.records[-1].structured_output == structured.SENT
    for _ in range(100):  # the old route is closed: no call was left on it
        if list(pipeline.service.routes()) == [pipeline.service.live.routes["gpt"]]:
            break
        await asyncio.sleep(0.01)
    assert list(pipeline.service.routes()) == [pipeline.service.live.routes["gpt"]]


async def test_an_error_answer_keeps_its_status_and_is_recorded(pipeline: Pipeline) -> None:
    error = {"error": {"message": "no such thing", "type": "invalid_request_error"}}
    pipeline.server.queue(json_answer(404, error))
    with pytest.raises(GatewayError) as info:
        await pipeline.chat()
    assert info.value.http_status == 404 and info.value.message == "no such thing"
    assert (pipeline.record.status, pipeline.record.http_status) == ("error", 404)
