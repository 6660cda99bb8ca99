"""The pipeline: the one place where routing, preparation, the upstream call and metering meet.

Every caller request that names a model ends in exactly one ``CallRecord``,
submitted in a ``finally``. The pipeline knows providers only through
``providers.base``; it must not branch on a provider's kind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from boundedcode_gateway import discard
from boundedcode_gateway.attempts import Attempts
from boundedcode_gateway.errors import (
    GatewayError,
    ModelNotFound,
    StreamBroken,
    UpstreamFailure,
    internal_error,
)
from boundedcode_gateway.llama_server.cache_keeper import AnsweredCall, CacheKeeper
from boundedcode_gateway.metering.meter import CallContext, Meter
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.metering.writer import MeterWriter
from boundedcode_gateway.policy import structured
from boundedcode_gateway.policy.cache_misses import ContinuityTable, PreviousCall, classify
from boundedcode_gateway.policy.capabilities import check_request
from boundedcode_gateway.policy.history_diff import HistoryTracker
from boundedcode_gateway.policy.reasoning import REASONING_FIELD
from boundedcode_gateway.policy.structured import requested_schema
from boundedcode_gateway.providers.base import ChatCall, RequestOptions, Upstream
from boundedcode_gateway.reasoning_store.keys import keys_for, text_of
from boundedcode_gateway.reasoning_store.store import ReasoningStore
from boundedcode_gateway.relay import BROKEN_STREAM_RESENDS, StreamRelay
from boundedcode_gateway.upstream.capabilities import Capabilities
from boundedcode_gateway.upstream.http import HttpClient, read_body
from boundedcode_gateway.upstream.metrics import CallMetrics

__all__ = ["GatewayService", "JsonAnswer", "StreamAnswer"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class JsonAnswer:
    status: int
    body: bytes


@dataclass(slots=True)
class StreamAnswer:
    first: bytes
    relay: StreamRelay


def _options(
    body: dict[str, Any],
    discard_header: bool,
    capture_reasoning: bool,
    capture_content: bool,
    capture_answer: bool,
) -> RequestOptions:
    stream = body.get("stream") is True
    stream_options = body.get("stream_options")
    include_usage = (
        stream and isinstance(stream_options, dict) and stream_options.get("include_usage") is True
    )
    return RequestOptions(
        stream=stream,
        include_usage=bool(include_usage),
        return_progress=stream and body.get("return_progress") is True,
        capture_reasoning=capture_reasoning,
        capture_content=capture_content,
        capture_answer=capture_answer,
        understands_discard=stream and (discard_header or discard.body_declares(body)),
    )


class GatewayService:
    """Routes a validated request to its upstream and meters the call."""

    def __init__(
        self,
        upstreams: dict[str, Upstream],
        http: HttpClient,
        writer: MeterWriter,
        reasoning: ReasoningStore,
    ) -> None:
        self.upstreams = upstreams
        self._http = http
        self._writer = writer
        self._reasoning = reasoning
        self._history = HistoryTracker()
        self._continuity = ContinuityTable()
        self._keepers: dict[str, CacheKeeper] = {}
        # (profile, schema form) pairs whose upstream refused a schema
        self._schema_refused: set[tuple[str, str]] = set()

    def record_rejected(self, ctx: CallContext, model: str, exc: GatewayError) -> None:
        """Meter a request refused before routing (bad input that still named a model)."""
        Meter(self._writer, ctx, model).error(exc)

    async def chat(self, ctx: CallContext, body: dict[str, Any]) -> JsonAnswer | StreamAnswer:
        """Answer one validated chat-completions request."""
        model: str = body["model"]
        meter = Meter(self._writer, ctx, model)
        meter.record.messages = len(body["messages"])
        try:
            upstream = self.upstreams.get(model)
            if upstream is None:
                raise ModelNotFound(
                    f"The model '{model}' does not exist on this gateway", param="model"
                )
            return await self._call(meter, upstream, body)
        except GatewayError as exc:
            meter.error(exc)
            raise
        except asyncio.CancelledError:
            meter.cancelled()
            raise
        except Exception as exc:
            internal = internal_error(ctx.call_id)
            meter.error(internal)
            raise internal from exc

    @property
    def keepers(self) -> dict[str, CacheKeeper]:
        """The cache keepers made so far, by profile."""
        return self._keepers

    def keeper(self, upstream: Upstream) -> CacheKeeper | None:
        """The cache keeper of a profile whose server's cache can be read (made on first use)."""
        keeper = self._keepers.get(upstream.name)
        if keeper is None:
            server = upstream.cache_server()
            if server is None:
                return None
            keeper = CacheKeeper(upstream.name, server, self._http, self._writer)
            self._keepers[upstream.name] = keeper
        return keeper

    async def close(self) -> None:
        """Stop the follow-ups still running (before the upstreams and the writer close)."""
        for keeper in self._keepers.values():
            await keeper.close()

    def structured_output_refused(self, upstream: Upstream) -> bool:
        """Whether this profile's upstream refused a schema in its form (for the process's life)."""
        return (upstream.name, upstream.schema_form) in self._schema_refused

    async def _call(
        self, meter: Meter, upstream: Upstream, body: dict[str, Any]
    ) -> JsonAnswer | StreamAnswer:
        ctx, record = meter.ctx, meter.record
        record.provider = upstream.provider
        record.upstream_model = upstream.upstream_model
        record.changed = self._history.observe(ctx.task, ctx.purpose, body["messages"])
        caps = await upstream.capabilities()
        keeper = self.keeper(upstream)
        if keeper is not None:
            keeper.call_started()
        schema = requested_schema(body)
        options = _options(
            body,
            ctx.discard_header,
            capture_reasoning=caps.reasoning_back,
            capture_content=schema is not None,
            capture_answer=keeper is not None,
        )
        body = discard.without_stream_option(body)
        record.stream = options.stream
        check_request(body, caps, upstream.name)
        task_reasoning = await self._reasoning.task(ctx.task)
        call = ChatCall(body, options, caps, schema, task_reasoning, ctx.call_id)
        answered = text_of(body["messages"][-1].get("content"))
        conversation = (ctx.task, ctx.purpose, upstream.name)
        previous = self._continuity.previous(conversation) if keeper is not None else None
        sent: list[bytes] = []  # the request the answer came from (the last one sent)

        def on_answer(metrics: CallMetrics) -> None:
            captured = metrics.captured
            if captured is not None:
                keys = keys_for(captured.tool_call_ids, captured.text, answered)
                task_reasoning.keep(
                    captured.kind, keys, upstream.provider, upstream.name, captured.data
                )
            if schema is not None and record.structured_output == structured.SENT:
                record.schema_valid = structured.schema_verdict(
                    metrics.answer_text, metrics.finish_reason, schema.schema
                )
                if record.schema_valid is False:
                    log.warning(
                        "model %s: the reply does not match the schema it was sent", upstream.name
                    )
            if keeper is not None:
                self._follow_cache(keeper, meter, previous, body, sent[-1], metrics, caps)

        def send_once(with_schema: bool) -> Awaitable[JsonAnswer | StreamAnswer]:
            prepared = upstream.prepare(call, send_schema=with_schema)
            record.adjustments.update(prepared.adjustments)
            sent.append(prepared.body)
            attempts = Attempts(self._http, upstream, prepared, record)
            return self._answer(meter, upstream, attempts, options, on_answer)

        async def send(with_schema: bool) -> JsonAnswer | StreamAnswer:
            try:
                return await send_once(with_schema)
            except UpstreamFailure as exc:
                # the adapter may leave out what the model refused, and say so
                if not upstream.learn_from_refusal(exc.http_status, exc.message):
                    raise
            return await send_once(with_schema)

        if schema is None:
            return await send(False)
        return await self._send_with_schema(upstream, record, send)

    def _follow_cache(
        self,
        keeper: CacheKeeper,
        meter: Meter,
        previous: PreviousCall | None,
        body: dict[str, Any],
        sent: bytes,
        metrics: CallMetrics,
        caps: Capabilities,
    ) -> None:
        """Name this call's cache miss, remember it for the next call of its conversation,
        and hand the answer to the keeper."""
        ctx, record = meter.ctx, meter.record
        report = classify(previous, metrics.prompt_tokens, metrics.cached_tokens, record.changed)
        if report is not None:
            record.reusable_tokens = report.reusable_tokens
            record.miss_cause = report.cause
            record.miss_at = report.at
        answer = metrics.answer_message
        if metrics.prompt_tokens is None or metrics.completion_tokens is None or answer is None:
            return
        now = PreviousCall(metrics.prompt_tokens, metrics.completion_tokens, len(body["messages"]))
        self._continuity.remember((ctx.task, ctx.purpose, record.model_profile), now)
        had_reasoning = bool(answer.get(REASONING_FIELD))
        if not caps.reasoning_back:
            answer = {k: v for k, v in answer.items() if k != REASONING_FIELD}
        keeper.answered(
            AnsweredCall(
                ctx.task,
                ctx.purpose,
                record.model_profile,
                sent,
                answer,
                had_reasoning,
                caps.reasoning_back,
                now,
            )
        )

    async def _send_with_schema(
        self,
        upstream: Upstream,
        record: CallRecord,
        send: Callable[[bool], Awaitable[JsonAnswer | StreamAnswer]],
    ) -> JsonAnswer | StreamAnswer:
        """Send with the schema; a provider that refuses it gets the call once more without,
        and is not sent one again."""
        if self.structured_output_refused(upstream):
            record.structured_output = structured.SKIPPED_KNOWN_REJECTION
            return await send(False)
        record.structured_output = structured.SENT
        try:
            return await send(True)
        except UpstreamFailure as exc:
            if not structured.is_schema_rejection(exc.http_status, exc.message):
                raise
        # the provider refused the schema: the prompt still describes the JSON
        self._schema_refused.add((upstream.name, upstream.schema_form))
        record.structured_output = structured.DROPPED_AFTER_REJECTION
        return await send(False)

    async def _answer(
        self,
        meter: Meter,
        upstream: Upstream,
        attempts: Attempts,
        options: RequestOptions,
        on_answer: Callable[[CallMetrics], None],
    ) -> JsonAnswer | StreamAnswer:
        if not options.stream:
            return await self._answer_whole(meter, upstream, attempts, options, on_answer)
        relay = StreamRelay(
            meter,
            attempts,
            lambda: upstream.stream_translator(options),
            options,
            on_answer,
            continue_from=lambda partial: upstream.continuation(
                attempts.prepared, partial, options
            ),
        )
        try:
            first = await relay.open()
        except BaseException:
            relay.release()
            raise
        return StreamAnswer(first, relay)

    async def _answer_whole(
        self,
        meter: Meter,
        upstream: Upstream,
        attempts: Attempts,
        options: RequestOptions,
        on_success: Callable[[CallMetrics], None],
    ) -> JsonAnswer:
        """A non-streamed answer; a body cut short is sent once more, like a broken stream."""
        resends = 0
        while True:
            resp = await attempts.open()
            try:
                raw = await read_body(resp)
            except StreamBroken as exc:
                attempts.log(exc.http_status, exc.code)
                if resends >= BROKEN_STREAM_RESENDS:
                    raise
                resends += 1
                meter.record.retried = True
                continue
            metrics = CallMetrics()
            try:
                out = upstream.from_response(raw, metrics, options)
            except GatewayError as exc:
                attempts.log(exc.http_status, exc.code)
                raise
            attempts.log(200, None)
            on_success(metrics)
            meter.metrics(metrics)
            meter.derive_ttft(metrics)
            meter.ok()
            return JsonAnswer(200, out)
