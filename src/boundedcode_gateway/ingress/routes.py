"""The routes of the front, as plain ASGI: chat completions, models, health, and the
operator's metrics and readiness.

Checks where a request comes from and who sends it (``access/``), reads and
bounds the body, validates it, and hands it to the service. The caller's
disconnect cancels the call. It must not talk to upstreams itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from boundedcode_gateway import discard
from boundedcode_gateway.access.authenticate import check_model, metered_task
from boundedcode_gateway.access.sites import check_json_body
from boundedcode_gateway.asgi.body import BodyParser
from boundedcode_gateway.asgi.body_read import BodyPace, ReadingBudget, read_request_body
from boundedcode_gateway.asgi.render import (
    Message,
    Receive,
    Send,
    end_stream,
    send_body,
    send_chunk,
    send_error,
    send_json,
    start_stream,
)
from boundedcode_gateway.call_context import CallContext, Caller, reasoning_scope
from boundedcode_gateway.config import LimitsSettings, ReasoningSharing
from boundedcode_gateway.errors import (
    BodiesOverBudget,
    BodyTooLarge,
    BodyTooSlow,
    CallerLeft,
    Forbidden,
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    internal_error,
)
from boundedcode_gateway.fronts.base import (
    CHAT,
    AdjustingCall,
    Front,
    FrontCall,
    FrontStream,
    TokenCounter,
)
from boundedcode_gateway.fronts.sealing import SealBinding
from boundedcode_gateway.ingress.validate import (
    DEFAULT_PURPOSE,
    DEFAULT_TASK,
    check_chat_body,
    check_purpose,
    check_task,
)
from boundedcode_gateway.metering.records import TOKEN_COUNT_PURPOSE
from boundedcode_gateway.metering.request_facts import RequestFacts
from boundedcode_gateway.operations.failure_log import FailureLog
from boundedcode_gateway.operations.metrics import GatewayMetrics
from boundedcode_gateway.operations.readiness import readiness
from boundedcode_gateway.service import GatewayService, JsonAnswer, StreamAnswer
from boundedcode_gateway.text import clip
from boundedcode_gateway.ui.routes import UiRoutes

# without /v1, as some OpenAI clients send it (no task form)
CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
# the operator's view of the gateway, answered by ``Router._operations``
OPERATIONS_PATHS = frozenset({"/metrics", "/ready"})
# liveness: answered to anyone, before any check (it tells nothing)
HEALTH_PATHS = frozenset({"/health", "/v1/health"})
# Anthropic's SDKs send the key here: taken by the other fronts when Authorization is absent
API_KEY_HEADER = b"x-api-key"
# the front where x-api-key wins over Authorization (Anthropic's rule)
KEY_FIRST_FRONT = "messages"
TASK_HEADER = b"x-boundedcode-task"
PURPOSE_HEADER = b"x-boundedcode-purpose"


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _access_headers(
    scope: dict[str, Any],
) -> tuple[str | None, str | None, str | None, str | None]:
    """(Host, Origin, Authorization, Content-Type), found in one pass over the headers."""
    host = origin = authorization = content_type = None
    for key, value in scope["headers"]:
        if key == b"host":
            host = value.decode("latin-1")
        elif key == b"origin":
            origin = value.decode("latin-1")
        elif key == b"authorization":
            authorization = value.decode("latin-1")
        elif key == b"content-type":
            content_type = value.decode("latin-1")
    return host, origin, authorization, content_type


def front_of(fronts: Mapping[str, Front], path: str) -> tuple[Front | None, str | None]:
    """(the front a path is a call of, None for any other path; the task in the path)."""
    if path in CHAT_PATHS:
        return CHAT, None
    front = fronts.get(path)
    if front is not None:
        return front, None
    if path.startswith("/tasks/"):
        task, slash, rest = path[len("/tasks/") :].partition("/")
        front = fronts.get(slash + rest)
        if front is not None:
            return front, task
    return None, None


def _credential(
    scope: dict[str, Any], front: Front | None, authorization: str | None
) -> str | None:
    """The caller's key as a Bearer credential. A call of a front other than chat's may
    give it as ``x-api-key`` (where Anthropic's SDKs sent it before their 2026-10-21
    majors, which send ``Authorization: Bearer``): taken when Authorization is absent,
    and on the Messages front, as Anthropic does, in its place when both come."""
    if front is None or front is CHAT:
        return authorization
    key = _header(scope, API_KEY_HEADER)
    if key is None or (authorization is not None and front.name != KEY_FIRST_FRONT):
        return authorization
    return "Bearer " + key


def _headers_of(scope: dict[str, Any]) -> dict[str, str]:
    """The request's headers by lower-case name (the last of repeated ones)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


class Router:
    """Dispatches HTTP requests to the handlers."""

    def __init__(
        self,
        service: GatewayService,
        metrics: GatewayMetrics,
        body_parser: BodyParser | None = None,
        ui: UiRoutes | None = None,
        fronts: Mapping[str, Front] | None = None,
        failures: FailureLog | None = None,
        reading: ReadingBudget | None = None,
    ) -> None:
        self.service = service
        # told of a call refused before it had a record (a recorded one is seen from it)
        self.failures = failures
        # the fronts by their call's path (fronts/registry.py)
        self.fronts = fronts if fronts is not None else {"/v1/chat/completions": CHAT}
        self.metrics = metrics
        self.ui = ui
        self.body_parser = body_parser or BodyParser(LimitsSettings().max_parsing_bytes)
        # the bytes of the bodies being read at once
        self.reading = reading or ReadingBudget(LimitsSettings().max_reading_bytes)
        self.started_at = time.time()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        if path in HEALTH_PATHS:
            await send_json(send, 200, b'{"status":"ok"}')
            return
        front, path_task = front_of(self.fronts, path)
        ui = self.ui if self.ui is not None and UiRoutes.serves(path) else None
        # a call's own refusals, once it is past its access checks, are told by _call
        calling = False
        try:
            host, origin, authorization, content_type = _access_headers(scope)
            # one configuration for the whole request, whatever a reload does meanwhile
            live = self.service.live
            live.sites.check(host, origin)
            authenticator = live.authenticator
            caller = None
            if authenticator is not None:
                # a browser opens the page: it may give the key as HTTP Basic's password
                login = authenticator.viewer if ui is not None else authenticator.caller
                caller = login(_credential(scope, front, authorization))
            if ui is not None:
                ui.check_access(live.config.ui, caller)
                await ui(scope, receive, send, self._readmits(ui, host, origin, authorization))
            elif front is not None:
                if method != "POST":
                    raise MethodNotAllowed(f"Use POST for {path}")
                check_json_body(content_type)
                calling = True
                await self._call(
                    scope,
                    receive,
                    send,
                    front,
                    path_task,
                    caller,
                    live.max_body_bytes,
                    BodyPace.of(live.config.limits),
                    live.config.reasoning.shared_by,
                )
            elif path in OPERATIONS_PATHS:
                await self._operations(send, path, caller)
            elif path == "/v1/models":
                await send_json(send, 200, orjson.dumps(await self._models(caller)))
            elif path.startswith("/v1/models/"):
                model = await self._model(path[11:], caller, with_servers=True)
                await send_json(send, 200, orjson.dumps(model))
            else:
                raise NotFound(f"Unknown path: {method} {path}")
        except (BodyTooLarge, BodyTooSlow, BodiesOverBudget) as exc:
            # the rest of the body is not read: the connection cannot carry another request
            await send_error(send, exc, close=True, front=front)
        except GatewayError as exc:
            self._unrecorded(front, exc, told=calling)
            await send_error(send, exc, front=front)
        except Exception:
            # a fault outside a call's own handling (a chat call records its own)
            error = internal_error(f"{method} {path}")
            self._unrecorded(front, error)
            await send_error(send, error, front=front)

    def _readmits(
        self, ui: UiRoutes, host: str | None, origin: str | None, authorization: str | None
    ) -> Callable[[], bool]:
        """Whether the page's request would be let in by the configuration in force now:
        the checks above, asked again after a reload of an event stream still open."""

        def admitted() -> bool:
            live = self.service.live
            try:
                live.sites.check(host, origin)
                authenticator = live.authenticator
                caller = authenticator.viewer(authorization) if authenticator else None
                ui.check_access(live.config.ui, caller)
            except Exception:
                # a refusal, or any fault in asking: the stream is ended, not kept open
                return False
            return True

        return admitted

    def _unrecorded(self, front: Front | None, exc: GatewayError, told: bool = False) -> None:
        """A call refused without a record (``front``: None for a request that is not a
        call): its line on stderr all the same, unless ``told`` already."""
        if self.failures is not None and front is not None and not told:
            self.failures.refused(front.name, exc)

    async def _operations(self, send: Send, path: str, caller: Caller | None) -> None:
        """``/metrics`` (Prometheus' text format) and ``/ready`` (200, or 503 naming each
        profile that is not ready and why): with ``auth:``, for an admin key only."""
        if caller is not None and not caller.admin:
            raise Forbidden(f"{path} is for an admin key", code="admin_required")
        if path == "/metrics":
            body, content_type = self.metrics.exposition()
            await send_body(send, 200, body, content_type.encode("latin-1"))
            return
        ready = await readiness(self.service.upstreams)
        await send_json(send, ready.status, orjson.dumps(ready.to_json()))

    async def _models(self, caller: Caller | None) -> dict[str, Any]:
        names = [n for n in self.service.upstreams if caller is None or caller.may_use(n)]
        return {"object": "list", "data": [await self._model(n, caller) for n in names]}

    async def _model(
        self, name: str, caller: Caller | None, with_servers: bool = False
    ) -> dict[str, Any]:
        """A profile as OpenAI's model object, with its capabilities; ``with_servers``: and
        a local profile's servers with their state (one model asked for by name)."""
        upstream = self.service.upstreams.get(name)
        # a model the caller may not use is not shown to exist
        if upstream is None or (caller is not None and not caller.may_use(name)):
            raise ModelNotFound(
                f"The model '{clip(name)}' does not exist on this gateway", param="model"
            )
        caps = (await upstream.capabilities()).to_json()
        if self.service.structured_output_refused(upstream):
            caps["structured_output"] = False
        model = {
            "id": name,
            "object": "model",
            "created": int(self.started_at),
            "owned_by": upstream.provider,
            "upstream_model": upstream.upstream_model,
            "capabilities": caps,
        }
        servers = await self.service.servers_of(name) if with_servers else None
        if servers is not None:
            # names and states only: a process's command line is for the page of calls
            model["servers"] = [{"name": s["name"], "state": s["state"]} for s in servers]
        return model

    def _context(
        self,
        scope: dict[str, Any],
        path_task: str | None,
        caller: Caller | None,
        front: Front,
        shared_by: ReasoningSharing,
    ) -> CallContext:
        header_task = _header(scope, TASK_HEADER)
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
        purpose = _header(scope, PURPOSE_HEADER)
        purpose = check_purpose(purpose) if purpose is not None else DEFAULT_PURPOSE
        return CallContext.new(
            task if task is not None else DEFAULT_TASK,
            # a count is recorded as one, whatever the caller's purpose (checked all the same)
            TOKEN_COUNT_PURPOSE if isinstance(front, TokenCounter) else purpose,
            discard.header_declares(_header(scope, discard.HEADER)),
            caller,
            front.name,
            reasoning_scope(caller, shared_by),
        )

    @staticmethod
    def _refused_context(
        scope: dict[str, Any], path_task: str | None, caller: Caller | None, front: Front
    ) -> CallContext:
        """The context a call refused before its own was made is recorded under."""
        purpose = TOKEN_COUNT_PURPOSE if isinstance(front, TokenCounter) else DEFAULT_PURPOSE
        if caller is not None and caller.task is not None:
            # a token's calls are metered under its task only, whatever they asked for
            return CallContext.new(caller.task, purpose, caller=caller, front=front.name)
        raw_task = path_task or _header(scope, TASK_HEADER) or DEFAULT_TASK
        return CallContext.new(raw_task[:128], purpose, caller=caller, front=front.name)

    async def _call(
        self,
        scope: dict[str, Any],
        receive: Receive,
        send: Send,
        front: Front,
        path_task: str | None,
        caller: Caller | None,
        max_body_bytes: int,
        pace: BodyPace,
        shared_by: ReasoningSharing,
    ) -> None:
        """One call in any front: its request made a chat-completions body, checked as
        one, answered, and the answer written back in the front's shape."""
        try:
            raw = await read_request_body(scope, receive, max_body_bytes, pace, self.reading)
            parsed: Any = await self.body_parser.parse(raw)
        except CallerLeft as exc:
            self._unrecorded(front, exc)  # one line; there is no one to answer
            return
        except GatewayError as exc:
            self._unrecorded(front, exc)
            raise
        # what the request said, read once: a refusal on the way is recorded with it
        asked = RequestFacts.of(parsed)
        model = asked.model
        try:
            ctx = self._context(scope, path_task, caller, front, shared_by)
        except GatewayError as exc:
            refused = self._refused_context(scope, path_task, caller, front)
            self._rejected(front, refused, asked, exc)
            raise
        try:
            if caller is not None and model is not None:
                check_model(caller, model)
            binding = SealBinding(ctx.task, ctx.scope)
            call = None if front is CHAT else front.open(parsed, _headers_of(scope), binding)
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
            await send_json(send, 200, front.counted(tokens))
            return
        await self._answer(receive, send, ctx, body, call)

    def _rejected(
        self, front: Front, ctx: CallContext, asked: RequestFacts, exc: GatewayError
    ) -> None:
        """A call refused before it was answered: recorded when it named a model (what a
        record is kept under), told on stderr either way."""
        if asked.model is not None:
            self.service.record_rejected(ctx, asked, exc)
        else:
            self._unrecorded(front, exc)

    async def _answer(
        self,
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
        work = asyncio.ensure_future(self._respond(send, ctx, body, call))
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
        self, send: Send, ctx: CallContext, body: dict[str, Any], call: FrontCall | None
    ) -> None:
        """The answer to ``body``; ``call``: written back in another front's shape."""
        answer = await self.service.chat(ctx, body)
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
