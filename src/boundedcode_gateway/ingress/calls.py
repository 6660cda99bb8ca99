"""The calls of every front: chat completions, Messages, Responses and Messages' token
count, at their paths and under ``/tasks/{task}``.

A call's body is read within its limits and its pace, parsed, made a chat-completions
body by its front and checked as one, then handed to the service; the answer goes
back in the front's shape (``ingress/answer.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from boundedcode_gateway import discard
from boundedcode_gateway.access.authenticate import check_model, metered_task
from boundedcode_gateway.access.sites import check_json_body
from boundedcode_gateway.asgi.body import BodyParser
from boundedcode_gateway.asgi.body_read import BodyPace, ReadingBudget, read_request_body
from boundedcode_gateway.asgi.render import send_json
from boundedcode_gateway.call_context import CallContext, Caller, reasoning_scope
from boundedcode_gateway.errors import CallerLeft, GatewayError, InvalidRequest, internal_error
from boundedcode_gateway.fronts.base import CHAT, AdjustingCall, Front, TokenCounter
from boundedcode_gateway.fronts.sealing import SealBinding
from boundedcode_gateway.ingress.answer import answer_call
from boundedcode_gateway.ingress.headers import header, headers_of
from boundedcode_gateway.ingress.table import Handler, Request, Route
from boundedcode_gateway.ingress.validate import (
    DEFAULT_PURPOSE,
    DEFAULT_TASK,
    check_chat_body,
    check_purpose,
    check_task,
)
from boundedcode_gateway.live_config import LiveConfig
from boundedcode_gateway.metering.records import TOKEN_COUNT_PURPOSE
from boundedcode_gateway.metering.request_facts import RequestFacts
from boundedcode_gateway.operations.failure_log import FailureLog
from boundedcode_gateway.service import GatewayService
from boundedcode_gateway.trace_context import TRACEPARENT, TRACESTATE, TraceContext, TracePolicy

# without /v1, as some OpenAI clients send it (no task form)
CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
# a front's path under this names the call's task
TASKS_PREFIX = "/tasks/"
TASK_HEADER = b"x-boundedcode-task"
PURPOSE_HEADER = b"x-boundedcode-purpose"
_POST = frozenset({"POST"})


class Calls:
    """Answers the calls of the fronts, and tells those refused without a record."""

    def __init__(
        self,
        service: GatewayService,
        body_parser: BodyParser,
        reading: ReadingBudget,
        failures: FailureLog | None,
    ) -> None:
        self.service = service
        self.body_parser = body_parser
        # the bytes of the bodies being read at once
        self.reading = reading
        # told of a call refused before it had a record (a recorded one is seen from it)
        self.failures = failures

    def routes(self, fronts: Mapping[str, Front]) -> Iterator[tuple[str, Route]]:
        """Each front's path, and under ``/tasks/{task}``; chat's also without /v1."""
        for path in CHAT_PATHS:
            yield path, self._route(CHAT)
        for path, front in fronts.items():
            yield path, self._route(front)
        for path, front in fronts.items():
            yield TASKS_PREFIX + "{task}" + path, self._route(front)

    def unrecorded(self, front: Front, exc: GatewayError) -> None:
        """A call refused without a record: its line on stderr all the same."""
        if self.failures is not None:
            self.failures.refused(front.name, exc)

    def _route(self, front: Front) -> Route:
        return Route(self._handler(front), methods=_POST, front=front)

    def _handler(self, front: Front) -> Handler:
        async def handle(request: Request) -> None:
            try:
                check_json_body(request.content_type)
            except GatewayError as exc:
                self.unrecorded(front, exc)
                raise
            await self._call(request, front)

        return handle

    async def _call(self, request: Request, front: Front) -> None:
        """One call in any front: its request made a chat-completions body, checked as
        one, answered, and the answer written back in the front's shape."""
        scope, live = request.scope, request.live
        path_task, caller = request.params.get("task"), request.caller
        pace = BodyPace.of(live.config.limits)
        try:
            raw = await read_request_body(
                scope, request.receive, live.max_body_bytes, pace, self.reading
            )
            parsed: Any = await self.body_parser.parse(raw)
        except CallerLeft as exc:
            self.unrecorded(front, exc)  # one line; there is no one to answer
            return
        except GatewayError as exc:
            self.unrecorded(front, exc)
            raise
        # what the request said, read once: a refusal on the way is recorded with it
        asked = RequestFacts.of(parsed)
        model = asked.model
        try:
            ctx = _context(scope, path_task, caller, front, live)
        except GatewayError as exc:
            refused = _refused_context(scope, path_task, caller, front, live.tracing)
            self._rejected(front, refused, asked, exc)
            raise
        try:
            if caller is not None and model is not None:
                check_model(caller, model)
            binding = SealBinding(ctx.task, ctx.scope)
            call = None if front is CHAT else front.open(parsed, headers_of(scope), binding)
            if isinstance(call, AdjustingCall):
                ctx.adjustments.update(call.adjustments)
            body = check_chat_body(parsed if call is None else call.body)
        except GatewayError as exc:
            self._rejected(front, ctx, asked, exc)
            raise
        except Exception as exc:
            # a fault in a front's reading of the request: a 500, recorded as the call's
            error = internal_error(ctx.call_id)
            self._rejected(front, ctx, asked, error)
            raise error from exc
        if front is not CHAT and isinstance(front, TokenCounter):
            # counted, not answered: under the same access checks and budgets as a call
            tokens = await self.service.count_tokens(ctx, body)
            await send_json(request.send, 200, front.counted(tokens))
            return
        await answer_call(self.service, request.receive, request.send, ctx, body, call)

    def _rejected(
        self, front: Front, ctx: CallContext, asked: RequestFacts, exc: GatewayError
    ) -> None:
        """A call refused before it was answered: recorded when it named a model (what a
        record is kept under), told on stderr either way."""
        if asked.model is not None:
            self.service.record_rejected(ctx, asked, exc)
        else:
            self.unrecorded(front, exc)


def _context(
    scope: dict[str, Any],
    path_task: str | None,
    caller: Caller | None,
    front: Front,
    live: LiveConfig,
) -> CallContext:
    header_task = header(scope, TASK_HEADER)
    if path_task is not None and header_task is not None and header_task != path_task:
        raise InvalidRequest(
            f"X-BoundedCode-Task '{header_task}' differs from the path's task '{path_task}'",
            param="X-BoundedCode-Task",
            code="invalid_task",
        )
    task = path_task if path_task is not None else header_task
    if task is not None:
        task = check_task(task)
    if caller is not None:
        task = metered_task(caller, task)
    purpose = header(scope, PURPOSE_HEADER)
    purpose = check_purpose(purpose) if purpose is not None else DEFAULT_PURPOSE
    return CallContext.new(
        task if task is not None else DEFAULT_TASK,
        # a count is recorded as one, whatever the caller's purpose (checked all the same)
        TOKEN_COUNT_PURPOSE if isinstance(front, TokenCounter) else purpose,
        discard.header_declares(header(scope, discard.HEADER)),
        caller,
        front.name,
        reasoning_scope(caller, live.config.reasoning.shared_by),
        _trace(scope, live.tracing),
    )


def _trace(scope: dict[str, Any], tracing: TracePolicy | None) -> TraceContext | None:
    """The call's span, a child of the caller's where it sent a traceparent."""
    if tracing is None:
        return None
    return tracing.start(header(scope, TRACEPARENT), header(scope, TRACESTATE))


def _refused_context(
    scope: dict[str, Any],
    path_task: str | None,
    caller: Caller | None,
    front: Front,
    tracing: TracePolicy | None,
) -> CallContext:
    """The context a call refused before its own was made is recorded under."""
    purpose = TOKEN_COUNT_PURPOSE if isinstance(front, TokenCounter) else DEFAULT_PURPOSE
    trace = _trace(scope, tracing)
    if caller is not None and caller.task is not None:
        # a token's calls are metered under its task only, whatever they asked for
        return CallContext.new(caller.task, purpose, caller=caller, front=front.name, trace=trace)
    raw_task = path_task or header(scope, TASK_HEADER) or DEFAULT_TASK
    return CallContext.new(raw_task[:128], purpose, caller=caller, front=front.name, trace=trace)
