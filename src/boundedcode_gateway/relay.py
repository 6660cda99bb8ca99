"""Relaying one streamed answer to the caller.

Holds the caller's status until the first content-bearing event, so an error
before it is a real HTTP error; after it, errors become an in-stream error
object. A stream that breaks (no finish reason, no ``[DONE]``) before any
content is sent once more, silently. Tool calls are held back until the
answer's finish (``tool_call_hold.py``), so what a caller was shown before a
break is text and reasoning only: an upstream that can go on with a partial
answer is asked to (once), and the caller sees one unbroken answer. Otherwise
only a caller that declared it understands the discard event gets the discard
chunk and the answer again; any other caller gets the in-stream error (a server
fault typed ``server_error``, as OpenAI's streams type one), never a second
answer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import orjson

from boundedcode_gateway.attempts import Attempts
from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.discard import discard_chunk
from boundedcode_gateway.errors import (
    GatewayError,
    ResponseTooLarge,
    StreamBroken,
    internal_error,
    redact_bytes,
    redact_error,
    secret_forms,
)
from boundedcode_gateway.providers.base import (
    Continuation,
    PartialAnswer,
    RequestOptions,
    StreamTranslator,
)
from boundedcode_gateway.secret_hold import HeldTranslator, SecretHold
from boundedcode_gateway.tool_call_hold import ToolCallHold
from boundedcode_gateway.upstream.http import UpstreamResponse, iter_body
from boundedcode_gateway.upstream.metrics import CallMetrics, CaptureLimit
from boundedcode_gateway.wire.sse import (
    DEFAULT_MAX_EVENT_BYTES,
    DONE_EVENT,
    EventTooLarge,
    SSEDecoder,
    SSEEvent,
    encode_data,
)

ContinueFrom = Callable[[PartialAnswer], Continuation | None]
# how the relayed call ended: its error (None when complete), and whether the caller left
OnEnd = Callable[[GatewayError | None, bool], None]


# one upstream answer streams at most this much (``inference.upstream_limits.max_stream_mib``)
DEFAULT_MAX_STREAM_BYTES = 256 << 20

# a streaming call tells its watcher how far it got at most this often
STREAMING_EVERY_MS = 500.0


class CallWatcher(Protocol):
    """Who is told how a streamed answer goes (the page of calls, ``ui/events.py``)."""

    def progress(self, call_id: str, processed: int, total: int, cache: int) -> None: ...

    def first_token(self, call_id: str, ttft_ms: float) -> None: ...

    def streaming(self, call_id: str, chunks: int, elapsed_ms: float) -> None: ...


def _no_continuation(partial: PartialAnswer) -> Continuation | None:
    return None


async def _nothing_to_wait_for() -> None:
    return None


class StreamRelay:
    """One streamed answer, from its first upstream response to the end of the call."""

    def __init__(
        self,
        ctx: CallContext,
        model: str,
        attempts: Attempts,
        new_translator: Callable[[], StreamTranslator],
        options: RequestOptions,
        on_success: Callable[[CallMetrics], None],
        on_end: OnEnd,
        continue_from: ContinueFrom = _no_continuation,
        recorded: Callable[[], Awaitable[None]] = _nothing_to_wait_for,
        secrets: tuple[str, ...] = (),
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        watcher: CallWatcher | None = None,
        max_stream_bytes: int = DEFAULT_MAX_STREAM_BYTES,
    ) -> None:
        self._ctx = ctx
        self._watcher = watcher
        # what the watcher was last told: prompt read, chunks relayed, when
        self._told_processed: int | None = None
        self._chunks = 0
        self._told_at_ms = 0.0
        self._model = model
        self._on_end = on_end
        # how the end of the stream waits for the call's record (`metering.sync`)
        self._recorded = recorded
        # what the call's record is filled from when it ends
        self.ttft_ms: float | None = None
        self.adjustments: dict[str, Any] = {}
        self._attempts = attempts
        self._new_translator = new_translator
        self._options = options
        self._on_success = on_success
        self._continue_from = continue_from
        self._continued = False
        # the profile's key: never relayed, whatever the upstream wrote
        self._secrets = secrets
        self._secret_forms = secret_forms(secrets)
        self._max_event_bytes = max_event_bytes
        # the bytes one upstream answer may stream, and what it has streamed so far
        self._max_stream_bytes = max_stream_bytes
        self._streamed = 0
        self._resp: UpstreamResponse | None = None
        self._translator: HeldTranslator = self._held(new_translator())
        self._decoder = SSEDecoder(max_event_bytes)
        self._pending: deque[SSEEvent] = deque()
        self._body: AsyncIterator[bytes] | None = None
        self._eof = False
        self._complete = False
        self._error: GatewayError | None = None
        self._closed = False

    # -- the upstream side

    async def _connect(self, continuation: Continuation | None = None) -> None:
        """Open (or reopen) the upstream stream with a fresh translator: the call's own
        request, or a continuation of it."""
        self._release_response()
        if continuation is None:
            self._resp = await self._attempts.open()
            self._translator = self._held(self._new_translator())
        else:
            self._resp = await self._attempts.for_request(continuation.request).open()
            self._translator = self._held(continuation.new_translator())
        self._decoder = SSEDecoder(self._max_event_bytes)
        self._streamed = 0
        self._pending.clear()
        self._body = iter_body(self._resp)
        self._eof = False

    def _held(self, translator: StreamTranslator) -> HeldTranslator:
        held = ToolCallHold(translator, CaptureLimit(self._options.max_captured_bytes))
        # a key the upstream writes across deltas of text is seen whole (only where
        # there is a key to hide: a stream without one pays nothing for it)
        return SecretHold(held, self._secrets) if self._secrets else held

    def _committed(self) -> bool:
        t = self._translator
        return (
            t.content_started or t.finished or (self._options.return_progress and t.progress_seen)
        )

    async def _fill(self) -> bool:
        """Read until an event is pending; False at the end of the upstream stream."""
        assert self._body is not None
        while not self._pending:
            if self._eof:
                return False
            try:
                chunk = await anext(self._body)
            except StopAsyncIteration:
                self._eof = True
                self._pending.extend(self._decoder.close())
                continue
            self._streamed += len(chunk)
            if self._streamed > self._max_stream_bytes:
                raise ResponseTooLarge(
                    "the upstream's streamed answer is larger than "
                    "inference.upstream_limits.max_stream_mib "
                    f"({self._max_stream_bytes / (1 << 20):g} MiB)"
                )
            try:
                self._pending.extend(self._decoder.feed(chunk))
            except EventTooLarge:
                raise ResponseTooLarge(
                    "an event of the upstream's stream is larger than "
                    "inference.upstream_limits.max_event_mib "
                    f"({self._max_event_bytes / (1 << 20):g} MiB)"
                ) from None
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
                error = redact_error(exc, self._secrets)
                break
            if until_commit and self._committed():
                break
        if t.generating and self.ttft_ms is None:
            self.ttft_ms = self._ctx.elapsed_ms()
            if self._watcher is not None:
                self._watcher.first_token(self._ctx.call_id, self.ttft_ms)
        if self._watcher is not None:
            self._tell(self._watcher, t.metrics, len(parts) // 3)
        out = b"".join(parts)
        return redact_bytes(out, self._secret_forms) if self._secret_forms else out, error

    def _tell(self, watcher: CallWatcher, metrics: CallMetrics, chunks: int) -> None:
        """The prompt read so far, when it moved; the chunks relayed, now and then."""
        call_id = self._ctx.call_id
        processed = metrics.prompt_processed
        if processed is not None and processed != self._told_processed:
            self._told_processed = processed
            total, cache = metrics.prompt_tokens or 0, metrics.cached_tokens or 0
            watcher.progress(call_id, processed, total, cache)
        if self.ttft_ms is None or not chunks:
            return
        self._chunks += chunks
        now = self._ctx.elapsed_ms()
        if now - self._told_at_ms >= STREAMING_EVERY_MS:
            self._told_at_ms = now
            watcher.streaming(call_id, self._chunks, now)

    def _broken(self) -> StreamBroken:
        return StreamBroken("the upstream stream ended with no finish reason and no [DONE]")

    async def _resend_after_break(self) -> bool:
        """Reopen if the attempts allow a resend after a break (False when they do not)."""
        if not await self._attempts.resend_after_break():
            return False
        await self._connect()
        return True

    # -- the caller side

    async def open(self) -> bytes:
        """Read until the first content-bearing event; an error before it raises."""
        await self._connect()
        held: list[bytes] = []
        while not self._committed():
            try:
                if not await self._fill():
                    raise self._broken()
                out, error = self._drain(until_commit=True)
            except StreamBroken as exc:
                # nothing was shown yet: the held role chunk goes with the broken answer
                self._attempts.log(exc.http_status, exc.code)
                if not await self._resend_after_break():
                    raise
                held.clear()
                continue
            except GatewayError as exc:
                self._attempts.log(exc.http_status, exc.code)
                raise
            if error is not None:
                # an error event before content is answered like an HTTP error
                await self._attempts.again_or_raise(error)
                await self._connect()
                held.clear()
                continue
            held.append(out)
        return b"".join(held)

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The rest of the stream; a break is answered as the module says."""
        while True:
            try:
                async for out in self._relay_current():
                    yield out
                return
            except StreamBroken as exc:
                try:
                    first = await self._answer_again(exc)
                except GatewayError as reopen_error:
                    yield await self._failed(reopen_error)
                    return
                if first is None:
                    yield await self._failed(exc)
                    return
                if first:
                    yield first
            except GatewayError as exc:
                self._attempts.log(exc.http_status, exc.code)
                yield await self._failed(exc)
                return
            except Exception:
                yield await self._failed(internal_error(self._ctx.call_id))
                return

    async def _answer_again(self, exc: StreamBroken) -> bytes | None:
        """After a break: go on from where it broke, or reopen; return what the caller gets
        first (the discard chunk, or nothing); None when this caller cannot be answered
        again."""
        self._attempts.log(exc.http_status, exc.code)
        shown = self._translator.content_started
        if shown and await self._continue_partial():
            return b""
        if self._continued:
            self.adjustments["continued_after_break"] = False
        if shown and not self._options.understands_discard:
            # a second answer would be glued to the first by a caller that cannot drop it
            return None
        if not await self._resend_after_break():
            return None
        return encode_data(self._discard(exc.message)) if shown else b""

    async def _continue_partial(self) -> bool:
        """Have the upstream go on with the text the caller was shown (once per answer)."""
        partial = self._translator.shown_text()
        if self._continued or partial is None:
            return False
        continuation = self._continue_from(partial)
        if continuation is None:
            return False
        self._continued = True
        self._attempts.continued()
        self.adjustments["continued_after_break"] = True
        self.adjustments["continued_from"] = {
            "content_chars": len(partial.content),
            "reasoning_chars": len(partial.reasoning),
        }
        try:
            await self._connect(continuation)
        except GatewayError:
            return False  # its attempts are logged; the answer goes on as after any break
        return True

    async def _relay_current(self) -> AsyncIterator[bytes]:
        while await self._fill():
            out, error = self._drain(until_commit=False)
            if out:
                yield out
            if error is not None:
                raise error
        if not self._translator.finished:
            raise self._broken()
        self._complete = True
        self._attempts.log(200, None)
        self._on_success(self._translator.metrics)
        self.close()  # recorded before the caller can see the end
        await self._recorded()
        yield DONE_EVENT

    def _discard(self, reason: str) -> bytes:
        return discard_chunk(self._ctx.call_id, self._model, reason)

    async def _failed(self, exc: GatewayError) -> bytes:
        """The in-stream error that ends the answer, once the call's record is written."""
        out = self._fail(exc)
        await self._recorded()
        return out

    def fail(self, exc: GatewayError) -> bytes:
        """End the answer with ``exc`` (a limit of the whole call, met outside the relay):
        the attempt is logged, the upstream closed; the in-stream error to send back.
        An answer already whole (recorded, its end held up on the way to the caller) is
        not turned into an error: its end is sent again."""
        if self._complete:
            return DONE_EVENT
        self._attempts.log(exc.http_status, exc.code)
        return self._fail(exc)

    def _fail(self, exc: GatewayError) -> bytes:
        # an answer that ends in an error is recorded as one, however far the upstream got
        self._complete = False
        self._error = exc
        self.close()
        return encode_data(orjson.dumps(exc.to_stream_body()))

    # -- the end

    def _release_response(self) -> None:
        if self._resp is None:
            return
        if self._complete:
            self._resp.release()
        else:
            self._resp.close()  # stops generation on the upstream
        self._resp = None

    @property
    def metrics(self) -> CallMetrics:
        """What the answer relayed so far measured."""
        return self._translator.metrics

    def release(self) -> None:
        """Give the connection back (or close it, which stops generation upstream)."""
        self._release_response()

    def close(self, cancelled: bool = False) -> None:
        """Release the upstream and record the call (once, whatever happened)."""
        if self._closed:
            return
        self._closed = True
        self.release()
        if self._complete:
            self._on_end(None, False)
        elif self._error is not None:
            self._on_end(self._error, False)
        elif cancelled:
            self._on_end(None, True)
        else:
            self._on_end(StreamBroken("the stream to the caller ended early"), False)
