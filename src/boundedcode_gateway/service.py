"""The pipeline: the one place where routing, preparation, the upstream call and metering meet.

Every caller request that names a model ends in exactly one ``CallRecord``,
submitted in a ``finally``. The pipeline knows providers only through
``providers.base``; it must not branch on a provider's kind.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson

from boundedcode_gateway.errors import (
    GatewayError,
    ModelNotFound,
    StreamBroken,
    UpstreamFailure,
)
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.metering.writer import MeterWriter
from boundedcode_gateway.policy.capabilities import check_request
from boundedcode_gateway.policy.history_diff import HistoryTracker
from boundedcode_gateway.providers.base import (
    CallMetrics,
    RequestOptions,
    StreamTranslator,
    Upstream,
)
from boundedcode_gateway.providers.http import HttpClient, iter_body, read_body
from boundedcode_gateway.wire.sse import DONE_EVENT, SSEDecoder, SSEEvent

CLIENT_CLOSED = 499  # nginx's convention for "the caller went away"


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True)
class CallContext:
    """Who asked and when: set by ingress before the body is read."""

    task: str
    purpose: str
    call_id: str
    started: float
    started_at: str

    @classmethod
    def new(cls, task: str, purpose: str) -> CallContext:
        return cls(task, purpose, "call_" + uuid.uuid4().hex, time.perf_counter(), utc_now_iso())

    def elapsed_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000.0, 3)


@dataclass(slots=True)
class JsonAnswer:
    status: int
    body: bytes


class Meter:
    """Fills one call's record and submits it exactly once."""

    __slots__ = ("_done", "_writer", "ctx", "record")

    def __init__(self, writer: MeterWriter, ctx: CallContext, model: str) -> None:
        self._writer = writer
        self.ctx = ctx
        self.record = CallRecord(
            call_id=ctx.call_id,
            started_at=ctx.started_at,
            task=ctx.task,
            purpose=ctx.purpose,
            model_profile=model,
        )
        self._done = False

    def metrics(self, m: CallMetrics) -> None:
        r = self.record
        r.prompt_tokens = m.prompt_tokens
        r.cached_tokens = m.cached_tokens
        r.completion_tokens = m.completion_tokens
        r.reasoning_tokens = m.reasoning_tokens
        r.evaluated_tokens = m.evaluated_tokens
        r.prefill_ms = m.prefill_ms
        r.decode_ms = m.decode_ms
        r.finish_reason = m.finish_reason
        if m.upstream_model:
            r.upstream_model = m.upstream_model

    def ok(self, http_status: int = 200) -> None:
        self._submit("ok", http_status, None)

    def error(self, exc: GatewayError) -> None:
        self._submit("error", exc.http_status, exc.code or exc.type)

    def cancelled(self) -> None:
        self._submit("error", CLIENT_CLOSED, "client_disconnected")

    def _submit(self, status: str, http_status: int, code: str | None) -> None:
        if self._done:
            return
        self._done = True
        r = self.record
        r.status = status
        r.http_status = http_status
        r.error_code = code
        r.total_ms = self.ctx.elapsed_ms()
        self._writer.submit(r)


class StreamRelay:
    """Relays one upstream stream to the caller, holding the status until content arrives."""

    def __init__(
        self,
        meter: Meter,
        resp: aiohttp.ClientResponse,
        translator: StreamTranslator,
        options: RequestOptions,
    ) -> None:
        self._meter = meter
        self._resp = resp
        self._translator = translator
        self._options = options
        self._decoder = SSEDecoder()
        self._pending: deque[SSEEvent] = deque()
        self._body = iter_body(resp)
        self._eof = False
        self._complete = False
        self._error: GatewayError | None = None
        self._closed = False

    def _committed(self) -> bool:
        t = self._translator
        return (
            t.content_started or t.finished or (self._options.return_progress and t.progress_seen)
        )

    async def _fill(self) -> bool:
        """Read until an event is pending; False at the end of the upstream stream."""
        while not self._pending:
            if self._eof:
                return False
            try:
                chunk = await anext(self._body)
            except StopAsyncIteration:
                self._eof = True
                self._pending.extend(self._decoder.close())
            else:
                self._pending.extend(self._decoder.feed(chunk))
        return True

    def _drain(self, until_commit: bool) -> tuple[bytes, GatewayError | None]:
        """Translate pending events into the caller's bytes, stopping at an error.

        ``until_commit`` stops right after the first content-bearing event, so the
        caller's status is decided by event order, not by how TCP split the bytes.
        """
        t = self._translator
        parts: list[bytes] = []
        error: GatewayError | None = None
        while self._pending:
            event = self._pending.popleft()
            try:
                for payload in t.feed(event.event, event.data):
                    parts += (b"data: ", payload, b"\n\n")
            except GatewayError as exc:
                error = exc
                break
            if until_commit and self._committed():
                break
        if self._meter.record.ttft_ms is None and t.content_started:
            self._meter.record.ttft_ms = self._meter.ctx.elapsed_ms()
        return b"".join(parts), error

    async def open(self) -> bytes:
        """Read until the first content-bearing event; an error before it raises."""
        held: list[bytes] = []
        while not self._committed():
            if not await self._fill():
                raise StreamBroken("the upstream stream ended before any answer")
            out, error = self._drain(until_commit=True)
            if error is not None:
                raise error
            held.append(out)
        return b"".join(held)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The rest of the stream; an error after content becomes an in-stream error object."""
        try:
            while await self._fill():
                out, error = self._drain(until_commit=False)
                if out:
                    yield out
                if error is not None:
                    raise error
            if not self._translator.finished:
                raise StreamBroken("the upstream stream ended with no finish reason and no [DONE]")
            self._complete = True
            self.close()  # recorded before the caller can see the end
            yield DONE_EVENT
        except GatewayError as exc:
            self._error = exc
            self.close()
            yield b"data: " + orjson.dumps(exc.to_body()) + b"\n\n"

    def release(self) -> None:
        """Give the connection back (or close it, which stops generation upstream)."""
        if self._complete:
            self._resp.release()
        else:
            self._resp.close()
        self._meter.metrics(self._translator.metrics)

    def close(self, cancelled: bool = False) -> None:
        """Release the upstream and record the call (once, whatever happened)."""
        if self._closed:
            return
        self._closed = True
        self.release()
        if self._complete:
            self._meter.ok()
        elif self._error is not None:
            self._meter.error(self._error)
        elif cancelled:
            self._meter.cancelled()
        else:
            self._meter.error(StreamBroken("the stream to the caller ended early"))


@dataclass(slots=True)
class StreamAnswer:
    first: bytes
    relay: StreamRelay


def _options(body: dict[str, Any]) -> RequestOptions:
    stream = body.get("stream") is True
    stream_options = body.get("stream_options")
    include_usage = (
        stream and isinstance(stream_options, dict) and stream_options.get("include_usage") is True
    )
    return RequestOptions(
        stream=stream,
        include_usage=bool(include_usage),
        return_progress=stream and body.get("return_progress") is True,
    )


class GatewayService:
    """Routes a validated request to its upstream and meters the call."""

    def __init__(
        self, upstreams: dict[str, Upstream], http: HttpClient, writer: MeterWriter
    ) -> None:
        self.upstreams = upstreams
        self._http = http
        self._writer = writer
        self._history = HistoryTracker()

    def record_rejected(self, ctx: CallContext, model: str, exc: GatewayError) -> None:
        """Meter a request refused before routing (bad input that still named a model)."""
        meter = Meter(self._writer, ctx, model)
        meter.error(exc)

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
        except Exception:
            meter.error(UpstreamFailure("internal error in the gateway", status=500))
            raise

    async def _call(
        self, meter: Meter, upstream: Upstream, body: dict[str, Any]
    ) -> JsonAnswer | StreamAnswer:
        ctx, record = meter.ctx, meter.record
        record.provider = upstream.provider
        record.upstream_model = upstream.upstream_model
        messages = body["messages"]
        record.changed = self._history.observe(ctx.task, ctx.purpose, messages)
        options = _options(body)
        record.stream = options.stream
        caps = await upstream.capabilities()
        check_request(body, caps, upstream.name)
        prepared = upstream.prepare(body, options, caps, ctx.call_id)
        record.attempts = 1
        resp = await self._http.send(
            "POST", prepared.url, prepared.headers, prepared.body, resend_safe=prepared.resend_safe
        )
        if resp.status != 200:
            raw = await read_body(resp)
            raise upstream.error_from_response(resp.status, raw, resp.headers)
        if not options.stream:
            raw = await read_body(resp)
            metrics = CallMetrics()
            out = upstream.from_response(raw, metrics)
            meter.metrics(metrics)
            meter.ok()
            return JsonAnswer(200, out)
        relay = StreamRelay(meter, resp, upstream.stream_translator(options), options)
        try:
            first = await relay.open()
        except BaseException:
            relay.release()
            raise
        return StreamAnswer(first, relay)
