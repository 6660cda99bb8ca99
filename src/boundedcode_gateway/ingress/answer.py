"""A call's answer written back to its caller: whole, or as a stream, in the shape of the
caller's front; cancelled when the caller goes away first."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from boundedcode_gateway.asgi.render import (
    Message,
    Receive,
    Send,
    end_stream,
    send_chunk,
    send_json,
    start_stream,
)
from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.errors import GatewayError
from boundedcode_gateway.fronts.base import FrontCall, FrontStream
from boundedcode_gateway.service import GatewayService, JsonAnswer, StreamAnswer


async def answer_call(
    service: GatewayService,
    receive: Receive,
    send: Send,
    ctx: CallContext,
    body: dict[str, Any],
    call: FrontCall | None = None,
) -> None:
    """Answer in a task of its own, cancelled if the caller goes away first.

    One task for the whole answer and a done-callback on the watcher, rather than
    a task per phase and an ``asyncio.wait``: this runs for every request.
    """
    work = asyncio.ensure_future(_respond(service, send, ctx, body, call))
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    # cancelling a finished answer is a no-op, so the callback may fire late
    watcher.add_done_callback(lambda _: work.cancel())
    try:
        await work
    except (asyncio.CancelledError, GatewayError):
        if not watcher.done() or watcher.cancelled():
            raise  # not the caller leaving: shutdown, or an error to answer with
        # the caller left: the call is recorded, there is no one to answer
    finally:
        watcher.cancel()


async def _respond(
    service: GatewayService,
    send: Send,
    ctx: CallContext,
    body: dict[str, Any],
    call: FrontCall | None,
) -> None:
    """The answer to ``body``; ``call``: written back in another front's shape."""
    answer = await service.chat(ctx, body)
    if isinstance(answer, JsonAnswer):
        out = answer.body if call is None else call.answer(answer.status, answer.body)
        await send_json(send, answer.status, out)
        return
    try:
        await _relay(send, answer, None if call is None else call.stream())
    finally:
        # a relay cancelled before it ran still owes its record
        answer.relay.close(cancelled=True)


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _relay(send: Send, answer: StreamAnswer, translate: FrontStream | None = None) -> None:
    """The stream to the caller; ``translate``: in another front's shape than chat's."""
    relay = answer.relay
    cancelled = False
    caller_send = send
    if translate is not None:
        send = _translating(send, translate)
    try:
        await start_stream(send, answer.first)
        if answer.deadline is None:
            async for chunk in relay.chunks():
                await send_chunk(send, chunk)
        else:
            await _relay_within(send, answer)
        if translate is not None:
            tail = translate.end()
            if tail:
                await send_chunk(caller_send, tail)
        await end_stream(send)
    except (asyncio.CancelledError, OSError):
        cancelled = True
        raise
    finally:
        relay.close(cancelled=cancelled)


async def _relay_within(send: Send, answer: StreamAnswer) -> None:
    """The rest of the stream until the call's deadline, which ends it in an in-stream
    error (the relay records it, and closes the upstream's answer)."""
    relay, deadline = answer.relay, answer.deadline
    assert deadline is not None
    timeout = asyncio.timeout_at(deadline.at)
    try:
        async with timeout, contextlib.aclosing(relay.chunks()) as chunks:
            async for chunk in chunks:
                await send_chunk(send, chunk)
    except TimeoutError:
        if not timeout.expired():
            raise
        await send_chunk(send, relay.fail(deadline.error()))


def _translating(send: Send, translate: FrontStream) -> Send:
    """``send`` with each piece of a streamed body translated to another front's shape
    (a piece that translates to nothing is not sent)."""

    async def translated(message: Message) -> None:
        if message["type"] == "http.response.body" and message.get("more_body"):
            chunk = message.get("body", b"")
            out = translate.feed(chunk) if chunk else b""
            if not out:
                return
            message = {**message, "body": out}
        await send(message)

    return translated
