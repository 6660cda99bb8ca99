"""One caller request, from its upstream's capabilities to its answer: the steps in order.

``CallFlow.run`` builds the call value once (``ChatCall``), sends it (with the
requested schema where the provider takes one, without it where it refused one),
and hands each answer to ``_answered``: the reasoning kept for the next turn,
the reply checked against the schema, the server's cache followed. The steps
return what they found, and ``end`` fills the call's record from it: the one
place a call's fields are written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from boundedcode_gateway import discard
from boundedcode_gateway.attempts import AttemptLog, Attempts
from boundedcode_gateway.errors import (
    GatewayError,
    StreamBroken,
    UpstreamFailure,
    UpstreamTimeout,
    redact_bytes,
    redact_error,
    redact_optional,
    secret_forms,
)
from boundedcode_gateway.json_values import raise_if_too_deep
from boundedcode_gateway.llama_server.cache_keeper import AnsweredCall, CacheKeeper
from boundedcode_gateway.llama_server.fleet import LocalFleet
from boundedcode_gateway.llama_server.pool import ServerLease
from boundedcode_gateway.metering.meter import Meter, derived_ttft
from boundedcode_gateway.policy import structured
from boundedcode_gateway.policy.cache_misses import (
    NOT_A_MISS,
    RESTORE_INEFFECTIVE,
    ContinuityTable,
    ConversationId,
    MissReport,
    PreviousCall,
    classify,
)
from boundedcode_gateway.policy.capabilities import check_request
from boundedcode_gateway.policy.history_diff import History, first_changed, stable_digest
from boundedcode_gateway.policy.reasoning import REASONING_FIELD
from boundedcode_gateway.policy.structured import requested_schema
from boundedcode_gateway.policy.volatile_lines import strip_system_messages
from boundedcode_gateway.providers.base import ChatCall, RequestOptions, Upstream
from boundedcode_gateway.reasoning_store.backend import CallReasoning, ReasoningBackend
from boundedcode_gateway.reasoning_store.keys import keys_for
from boundedcode_gateway.relay import CallWatcher, StreamRelay
from boundedcode_gateway.text import clip
from boundedcode_gateway.upstream.http import HttpClient, read_body
from boundedcode_gateway.upstream.metrics import DEFAULT_CAPTURED_BYTES, CallMetrics
from boundedcode_gateway.wire.chat import text_of

log = logging.getLogger(__name__)

# a call that left its conversation's server and still found its prompt cached (or had
# nothing to find) missed nothing
MOVED_NOT_MISSED = frozenset({NOT_A_MISS, "first_call"})


@dataclass(slots=True)
class JsonAnswer:
    status: int
    body: bytes


@dataclass(frozen=True, slots=True)
class CallDeadline:
    """When a call must have ended (``inference.max_call_s``), on the event loop's clock."""

    at: float
    limit_s: float

    @classmethod
    def after(cls, limit_s: float, elapsed_s: float) -> CallDeadline:
        """The deadline of a call that began ``elapsed_s`` ago."""
        return cls(asyncio.get_running_loop().time() + limit_s - elapsed_s, limit_s)

    def error(self) -> UpstreamTimeout:
        return UpstreamTimeout(
            f"the call ran longer than inference.max_call_s ({self.limit_s:g} s)"
        )


@dataclass(slots=True)
class StreamAnswer:
    first: bytes
    relay: StreamRelay
    # the rest of the stream must arrive before it (None: no limit)
    deadline: CallDeadline | None = None


@dataclass(slots=True)
class SharedState:
    """What every call of the process reads and adds to (the service owns it)."""

    http: HttpClient
    reasoning: ReasoningBackend
    history: History
    continuity: ContinuityTable
    # (profile, schema form) pairs whose upstream refused a schema
    schema_refused: set[tuple[str, str]]
    # told how each streamed answer goes (the page of calls); None when no one watches
    watcher: CallWatcher | None = None
    # given the messages and answer of a call whose trace captures them
    content: ContentSink | None = None


class ContentSink(Protocol):
    """Where a traced call's messages and answer go for its span (``observability/``),
    never into its record: the call log and the ledger hold no content."""

    def keep(self, call_id: str, messages: Any, answer: str | None) -> None: ...


def call_options(
    body: dict[str, Any],
    discard_header: bool,
    capture: Capture,
    max_captured_bytes: int = DEFAULT_CAPTURED_BYTES,
) -> RequestOptions:
    """What the caller asked for that changes how the answer is relayed."""
    stream = body.get("stream") is True
    stream_options = body.get("stream_options")
    include_usage = (
        stream and isinstance(stream_options, dict) and stream_options.get("include_usage") is True
    )
    return RequestOptions(
        stream=stream,
        include_usage=bool(include_usage),
        return_progress=stream and body.get("return_progress") is True,
        capture_reasoning=capture.reasoning,
        capture_content=capture.content,
        capture_answer=capture.answer,
        understands_discard=stream and (discard_header or discard.body_declares(body)),
        max_captured_bytes=max_captured_bytes,
    )


@dataclass(frozen=True, slots=True)
class Capture:
    """What of the answer the call keeps: its reasoning, its text, the whole message."""

    reasoning: bool
    content: bool
    answer: bool


def conversation_head(body: dict[str, Any]) -> str:
    """What tells a client's side requests (a title, a summary) from its main
    conversation on the same task, so each keeps a slot of its own: a digest of the first
    message, without the lines that change on every request (a billing nonce)."""
    first, _ = strip_system_messages(body["messages"][:1])
    return format(stable_digest(first[0]), "x") if first else ""


class CallFlow:
    """The steps of one call to one upstream, and what they found, for its record."""

    def __init__(
        self,
        shared: SharedState,
        meter: Meter,
        upstream: Upstream,
        fleet: LocalFleet | None,
        keeper: CacheKeeper | None,
        body: dict[str, Any],
    ) -> None:
        self._shared = shared
        self._meter = meter
        self._upstream = upstream
        # the profile's key, read once: no answer, record or error of this call holds it
        self._secrets = upstream.secrets()
        # a local profile's servers, one of which the call is leased
        self._fleet = fleet
        self._keeper = keeper
        self._caller_body = body
        self._previous: PreviousCall | None = None
        self._reasoning: CallReasoning | None = None  # the task's, once the call is built
        self._server: ServerLease | None = None  # a local call's, once the call is built
        self._sent = b""  # the request the answer came from (the last one sent)
        # what the steps found, for the record
        self._log = AttemptLog(meter.ctx.started, meter.ctx.trace)
        self._changed: int | None = None
        # the same, against the previous request of this call's own conversation
        self._own_changed: int | None = None
        self._digests: Sequence[int] = ()  # the request's, one a message
        self._conversation: ConversationId = ("", "", "", "")
        self._stream = False
        # the front's first, then what the upstream's adapter and the relay changed
        self._adjustments: dict[str, Any] = dict(meter.ctx.adjustments)
        self._structured_output: str | None = None
        self._schema_valid: bool | None = None
        self._miss: MissReport | None = None
        self._relay: StreamRelay | None = None  # the latest, for a streamed answer
        self._metrics: CallMetrics | None = None  # a whole answer's
        self._ttft_ms: float | None = None  # a whole answer's, from the server's timings
        self._ended = False

    async def run(self) -> JsonAnswer | StreamAnswer:
        call = await self._build()
        if call.schema is None:
            return await self._send(call, with_schema=False)
        return await self._send_with_schema(call)

    # -- the call value

    async def _build(self) -> ChatCall:
        """Everything the upstream's request is made from, in one value."""
        ctx, upstream, body = self._meter.ctx, self._upstream, self._caller_body
        try:
            history = self._shared.history
            compared = await history.compare(ctx.task, ctx.purpose, body["messages"])
            self._changed = self._own_changed = compared.changed
            self._digests = compared.digests
        except TypeError:
            raise_if_too_deep(body)
            raise
        caps = await upstream.capabilities()
        if self._keeper is not None:
            self._keeper.call_started()
        schema = requested_schema(body)
        traced = ctx.trace is not None and ctx.trace.capture_content
        capture = Capture(
            caps.reasoning_back, schema is not None or traced, self._keeper is not None
        )
        limits = self._shared.http.limits
        options = call_options(body, ctx.discard_header, capture, limits.captured_bytes)
        body = discard.without_stream_option(body)
        self._stream = options.stream
        check_request(body, caps, upstream.name)
        task_reasoning = self._reasoning = await self._shared.reasoning.task(ctx.task, ctx.scope)
        fleet = self._fleet
        head = conversation_head(body) if fleet is not None or self._keeper is not None else ""
        self._conversation = (ctx.task, ctx.purpose, upstream.name, head)
        if self._keeper is not None:
            previous, followed = self._shared.continuity.compared(self._conversation)
            self._previous = previous
            if not followed:
                # the history compared was another conversation's (a side request's)
                own = previous.digests if previous is not None else None
                self._own_changed = None if own is None else first_changed(own, self._digests)
        caller = ctx.caller.name if ctx.caller is not None else None
        # the call's server is leased before any request is made of it; its server is
        # chosen when the first request is sent (from its size)
        if fleet is not None:
            self._server = fleet.lease(ctx.task, ctx.purpose, caller, head)
        return ChatCall(body, options, caps, schema, task_reasoning, ctx.call_id)

    # -- sending

    async def _send_with_schema(self, call: ChatCall) -> JsonAnswer | StreamAnswer:
        """Send with the schema; a provider that refuses it gets the call once more without,
        and is not sent one again."""
        upstream = self._upstream
        refused = self._shared.schema_refused
        if (upstream.name, upstream.schema_form) in refused:
            self._structured_output = structured.SKIPPED_KNOWN_REJECTION
            return await self._send(call, with_schema=False)
        self._structured_output = structured.SENT
        try:
            return await self._send(call, with_schema=True)
        except UpstreamFailure as exc:
            if not structured.is_schema_rejection(exc.http_status, exc.message):
                raise
        # the provider refused the schema: the prompt still describes the JSON
        refused.add((upstream.name, upstream.schema_form))
        self._structured_output = structured.DROPPED_AFTER_REJECTION
        return await self._send(call, with_schema=False)

    async def _send(self, call: ChatCall, with_schema: bool) -> JsonAnswer | StreamAnswer:
        """Send; an adapter that left out what the model refused gets the call once more."""
        try:
            return await self._send_once(call, with_schema)
        except UpstreamFailure as exc:
            if not self._upstream.learn_from_refusal(exc.http_status, exc.message):
                raise
        return await self._send_once(call, with_schema)

    async def _send_once(self, call: ChatCall, with_schema: bool) -> JsonAnswer | StreamAnswer:
        try:
            prepared = self._upstream.prepare(call, send_schema=with_schema)
        except TypeError:
            raise_if_too_deep(call.body)
            raise
        # where it goes, before what the adapter changed counts: no server up, no request
        http = self._shared.http
        attempts = Attempts(http, self._upstream, prepared, self._log, server=self._server)
        self._adjustments.update(prepared.adjustments)
        self._sent = prepared.body
        if call.options.stream:
            return await self._open_stream(call, attempts)
        return await self._answer_whole(call, attempts)

    async def _open_stream(self, call: ChatCall, attempts: Attempts) -> StreamAnswer:
        upstream, options = self._upstream, call.options
        relay = StreamRelay(
            self._meter.ctx,
            upstream.name,
            attempts,
            lambda: upstream.stream_translator(options),
            options,
            lambda metrics: self._answered(call, metrics),
            self.end,
            continue_from=lambda partial: upstream.continuation(
                attempts.prepared, partial, options
            ),
            recorded=self.recorded,
            secrets=self._secrets,
            max_event_bytes=self._shared.http.limits.event_bytes,
            max_stream_bytes=self._shared.http.limits.stream_bytes,
            watcher=self._shared.watcher,
        )
        self._relay = relay
        try:
            first = await relay.open()
        except BaseException:
            relay.release()
            raise
        return StreamAnswer(first, relay)

    async def _answer_whole(self, call: ChatCall, attempts: Attempts) -> JsonAnswer:
        """A non-streamed answer; a body cut short is sent once more, like a broken stream."""
        while True:
            resp = await attempts.open()
            try:
                raw = await read_body(resp)
            except StreamBroken as exc:
                attempts.log(exc.http_status, exc.code)
                if not await attempts.resend_after_break():
                    raise
                continue
            except GatewayError as exc:  # an answer past the limits
                attempts.log(exc.http_status, exc.code)
                raise
            metrics = CallMetrics()
            secrets = self._secrets
            try:
                out = self._upstream.from_response(raw, metrics, call.options)
            except GatewayError as exc:
                redact_error(exc, secrets)
                attempts.log(exc.http_status, exc.code)
                raise
            if secrets:  # the key never reaches the caller, whatever the upstream wrote
                out = redact_bytes(out, secret_forms(secrets))
            attempts.log(200, None)
            self._answered(call, metrics)
            self._metrics = metrics
            self._ttft_ms = derived_ttft(self._meter.ctx.elapsed_ms(), metrics)
            return JsonAnswer(200, out)

    # -- the answer

    def _answered(self, call: ChatCall, metrics: CallMetrics) -> None:
        """Keep the answer's reasoning, check its reply against the schema, follow the cache."""
        upstream = self._upstream
        captured = metrics.captured
        if captured is not None:
            answered = text_of(call.body["messages"][-1].get("content"))
            keys = keys_for(captured.tool_call_ids, captured.text, answered)
            call.reasoning.keep(
                captured.kind, keys, upstream.provider, upstream.name, captured.data
            )
        if call.schema is not None and self._structured_output == structured.SENT:
            self._schema_valid = structured.schema_verdict(
                metrics.answer_text, metrics.finish_reason, call.schema.schema
            )
            if self._schema_valid is False:
                log.warning(
                    "model %s: the reply does not match the schema it was sent", upstream.name
                )
        if self._server is not None:
            changed = self._own_changed
            self._server.answered(metrics, diverged=changed is not None and changed >= 0)
        if self._keeper is not None:
            self._follow_cache(self._keeper, call, metrics)

    def _follow_cache(self, keeper: CacheKeeper, call: ChatCall, metrics: CallMetrics) -> None:
        """Name this call's cache miss, remember it for the next call of its conversation,
        and hand the answer to the keeper."""
        ctx, profile = self._meter.ctx, self._upstream.name
        miss = classify(
            self._previous, metrics.prompt_tokens, metrics.cached_tokens, self._own_changed
        )
        server = self._server
        moved = server.moved if server is not None else None
        if miss is not None and moved is not None and miss.cause not in MOVED_NOT_MISSED:
            # the server that held the conversation was left: nothing else explains it
            miss = dataclasses.replace(miss, cause=moved, at=None)
        restore = server.restore if server is not None else None
        if miss is not None and restore is not None and restore.failure is not None:
            # its slot file was there and bought nothing: that is the miss
            miss = dataclasses.replace(miss, cause=RESTORE_INEFFECTIVE, at=None)
        self._miss = miss
        root = server.current_root() if server is not None else None
        answer = metrics.answer_message
        if (
            metrics.prompt_tokens is None
            or metrics.completion_tokens is None
            or answer is None
            or root is None
        ):
            return
        now = PreviousCall(
            metrics.prompt_tokens,
            metrics.completion_tokens,
            len(call.body["messages"]),
            digests=self._digests,
        )
        self._shared.continuity.remember(self._conversation, now)
        had_reasoning = bool(answer.get(REASONING_FIELD))
        reasoning_back = call.caps.reasoning_back
        if not reasoning_back:
            answer = {k: v for k, v in answer.items() if k != REASONING_FIELD}
        keeper.answered(
            AnsweredCall(
                ctx.task,
                ctx.purpose,
                profile,
                root,
                server.server if server is not None else None,
                self._sent,
                answer,
                had_reasoning,
                reasoning_back,
                now,
                server.slot if server is not None else None,
                server.state if server is not None else None,
                ctx.trace,
            )
        )

    # -- the record

    async def recorded(self) -> None:
        """Once the reasoning the call kept is where the next call finds it (in a state
        database: before the caller sees the answer end) and, with ``metering.sync``, its
        record is written."""
        if self._reasoning is not None:
            await self._reasoning.saved()
        await self._meter.recorded()

    def end(self, error: GatewayError | None, cancelled: bool = False) -> None:
        """Fill the call's record from what the steps found, and submit it (once)."""
        if self._ended:
            return
        self._ended = True
        self._fill()
        self._keep_content()
        if self._server is not None:
            self._server.release()
        if cancelled:
            self._meter.cancelled()
        elif error is None:
            self._meter.ok()
        else:
            self._meter.error(error)

    def _keep_content(self) -> None:
        """The messages and the answer, for a trace that captures them."""
        trace, sink = self._meter.ctx.trace, self._shared.content
        if trace is None or not trace.capture_content or sink is None:
            return
        metrics = self._relay.metrics if self._relay is not None else self._metrics
        answer = metrics.answer_text if metrics is not None else None
        sink.keep(self._meter.ctx.call_id, self._caller_body.get("messages"), answer)

    def interrupted(self, error: GatewayError) -> None:
        """The attempt running when the call was stopped from outside (its deadline) is
        logged with the error that stopped it."""
        if self._log.current is not None:
            self._log.end(error.http_status, error.code)

    def _fill(self) -> None:
        """The record's call fields: the one place they are written."""
        r, upstream, relay = self._meter.record, self._upstream, self._relay
        r.provider = upstream.provider
        r.upstream_model = upstream.upstream_model
        r.stream = self._stream
        r.changed = self._changed
        r.conversation = self._conversation[3] or None
        r.attempts = self._log.count
        r.attempt_log = self._log.entries
        r.retried = self._log.retried
        r.server = self._server.server if self._server is not None else None
        slot = self._server.slot if self._server is not None else None
        r.slot = slot.index if slot is not None else None
        restore = self._server.restore if self._server is not None else None
        if restore is not None:
            r.restored_tokens = restore.tokens or None
            r.slot_restore_ms = restore.restore_ms
            r.slot_save_ms = restore.save_ms
            r.restore_failure = restore.failure
        r.structured_output = self._structured_output
        r.schema_valid = self._schema_valid
        r.adjustments = self._adjustments
        if relay is not None:
            r.adjustments = {**self._adjustments, **relay.adjustments}
            r.ttft_ms = relay.ttft_ms
        elif self._ttft_ms is not None:
            r.ttft_ms = self._ttft_ms
            r.ttft_derived = True
        if self._miss is not None:
            r.reusable_tokens = self._miss.reusable_tokens
            r.miss_cause = self._miss.cause
            r.miss_at = self._miss.at
        metrics = relay.metrics if relay is not None else self._metrics
        if metrics is not None:
            r.prompt_tokens = metrics.prompt_tokens
            r.cached_tokens = metrics.cached_tokens
            r.completion_tokens = metrics.completion_tokens
            r.reasoning_tokens = metrics.reasoning_tokens
            r.cache_write_tokens = metrics.cache_write_tokens
            r.evaluated_tokens = metrics.evaluated_tokens
            r.prefill_ms = metrics.prefill_ms
            r.decode_ms = metrics.decode_ms
            # words of the upstream's own: the key never reaches a record through them, and
            # they are bounded as a caller's are
            secrets = self._secrets
            if metrics.finish_reason:
                r.finish_reason = clip(redact_optional(metrics.finish_reason, secrets) or "")
            if metrics.upstream_model:
                r.upstream_model = clip(redact_optional(metrics.upstream_model, secrets) or "")
