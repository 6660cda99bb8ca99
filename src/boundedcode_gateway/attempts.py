"""Sending one prepared request until it is answered, as the retry policy allows.

Owns the attempt count and the per-attempt log of a call, and the one rule for
an answer that broke off (streamed, or a whole body cut short): it is sent once
more, and a second break is final. Where a request goes is joined here: its path
under the profile's base URL, or under the root of the local server the call was
leased. A call to a server of a pool whose server is found down, when it could not
be reached or its answer broke off, goes once to another server first
(``failover``): the lease moves, and the request goes to where it now points. The
retry decisions themselves are in ``policy/retry.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from boundedcode_gateway.errors import (
    GatewayError,
    MalformedResponse,
    ResponseTooLarge,
    UpstreamUnavailable,
)
from boundedcode_gateway.llama_server.pool import ServerLease
from boundedcode_gateway.policy.retry import decide, retry_after_s
from boundedcode_gateway.providers.base import PreparedRequest, Upstream
from boundedcode_gateway.trace_context import TraceContext, new_span_id
from boundedcode_gateway.upstream.http import HttpClient, UpstreamResponse, origin, read_body

Sleep = Callable[[float], Awaitable[None]]

# an answer that broke off is sent once more; a second break is final
BROKEN_ANSWER_RESENDS = 1
# the longest wait the caller is told to take (Retry-After), in seconds
RETRY_AFTER_CAP_S = 86400


@dataclass(slots=True)
class AttemptLog:
    """What the sends of one call came to: the call's record is filled from it at the end.

    Each entry: how the attempt ended (``status``, ``code``), why it was made (``kind``:
    first, retry, resend, failover, continuation), where it went (``to``, host:port),
    when it began, was sent and ended (``at_ms``, ``sent_ms``, ``end_ms``, from the call's
    start) and, in a traced call, its span's id (``span``), a span exported only where the
    call made more than one attempt.
    """

    # the call's start (``CallContext.started``), which the entries' times count from
    origin: float = field(default_factory=time.perf_counter)
    trace: TraceContext | None = None
    count: int = 0
    entries: list[dict[str, Any]] = field(default_factory=list)
    # an answer was sent again, or continued, after it broke off
    retried: bool = False
    # why the next attempt is made
    next_kind: str = "first"
    # the attempt under way, until it ends
    current: dict[str, Any] | None = None

    def _ms(self) -> float:
        return round((time.perf_counter() - self.origin) * 1000.0, 3)

    def begin(self, to: str) -> None:
        """An attempt begins, to host:port ``to``."""
        self.count += 1
        self.current = {"status": None, "code": None, "kind": self.next_kind, "to": to}
        self.current["at_ms"] = self._ms()
        if self.trace is not None:
            self.current["span"] = new_span_id()
        self.next_kind = "retry"

    def sending(self, headers: dict[str, str]) -> dict[str, str]:
        """The attempt's request goes out now, with ``headers`` and, where the call's
        trace is passed on, its ``traceparent`` (and the caller's ``tracestate``)."""
        current = self.current
        if current is not None:
            current["sent_ms"] = self._ms()
        trace = self.trace
        if trace is None or not trace.propagate:
            return headers
        # the upstream's work is the call's child: a call sent once has no attempt span
        out = {**headers, "traceparent": trace.header(trace.span_id)}
        if trace.state is not None:
            out["tracestate"] = trace.state
        return out

    def end(self, status: int, code: str | None) -> None:
        """The latest attempt ended so; an attempt not begun here is counted all the same."""
        entry = self.current
        if entry is None:
            entry = {"status": status, "code": code}
        else:
            entry["status"], entry["code"] = status, code
            entry["end_ms"] = self._ms()
            self.current = None
        self.entries.append(entry)


def _host_port(root: str) -> str:
    """host:port of a base URL, as the connection pool reads it."""
    _, host, port = origin(root)
    return f"{host}:{port}"


class Attempts:
    """The sends of one prepared request; each outcome goes into the call's attempt log.

    ``server``: the local server the call was leased (None for a cloud API); its server
    is chosen here, from the request's size, unless the call's earlier requests chose it.
    """

    def __init__(
        self,
        http: HttpClient,
        upstream: Upstream,
        prepared: PreparedRequest,
        log: AttemptLog,
        sleep: Sleep = asyncio.sleep,
        *,
        server: ServerLease | None = None,
        root: str | None = None,
    ) -> None:
        self._http = http
        self._upstream = upstream
        self._prepared = prepared
        self._log = log
        self._sleep = sleep
        self._started = time.monotonic()
        self._resends = 0
        self._server = server
        if root is None:
            root = server.root(len(prepared.body)) if server is not None else upstream.base_url
        self._root = root
        self._to = _host_port(root)
        self._headers = self._headers_there()
        # pinned to a slot of the call's own, under cache isolation
        self._body = prepared.body

    @property
    def prepared(self) -> PreparedRequest:
        """The request as last sent (pinned to its slot, where the call holds one)."""
        return dataclasses.replace(self._prepared, body=self._body)

    @property
    def url(self) -> str:
        return self._root + self._prepared.path

    def _headers_there(self) -> dict[str, str]:
        """The request's headers with the credentials of the server it goes to (a managed
        server's key is its alone), never another's."""
        headers = self._prepared.headers
        if self._server is None:
            return headers
        kept = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        return {**kept, **self._server.headers_for(self.url)}

    def for_request(self, prepared: PreparedRequest) -> Attempts:
        """The sends of another request for the same call: one log, budget and clock, and
        the server the call is on now."""
        other = Attempts(
            self._http,
            self._upstream,
            prepared,
            self._log,
            self._sleep,
            server=self._server,
            root=self._root,
        )
        other._started = self._started
        return other

    async def resend_after_break(self) -> bool:
        """Whether an answer that broke off is sent again: to another server if its own is
        down (once), else to the same (once); the call is then retried."""
        if await self._failed_over():
            return True
        if self._resends >= BROKEN_ANSWER_RESENDS:
            return False
        self._resends += 1
        self._log.retried = True
        self._log.next_kind = "resend"
        return True

    def continued(self) -> None:
        """An answer that broke off goes on from where it broke: the call was retried."""
        self._log.retried = True
        self._log.next_kind = "continuation"

    def log(self, status: int, code: str | None) -> None:
        """Note how the latest attempt ended."""
        self._log.end(status, code)

    async def open(self) -> UpstreamResponse:
        """A 200 response to the request, sending again where the policy allows."""
        p = self._prepared
        while True:
            log = self._log
            log.begin(self._to)
            if self._server is not None:
                # under cache isolation: in a slot of the call's own (after a failover, on
                # the new server)
                try:
                    self._body = await self._server.pinned(self._body)
                except GatewayError as exc:
                    self.log(exc.http_status, exc.code)
                    raise
            headers = log.sending(self._headers)
            try:
                resp = await self._http.send(
                    "POST", self.url, headers, self._body, resend_safe=p.resend_safe
                )
            except GatewayError as exc:
                if isinstance(exc, UpstreamUnavailable) and await self._failed_over():
                    self.log(exc.http_status, exc.code)
                    continue
                await self.again_or_raise(exc)
                continue
            if resp.status == 200:
                return resp
            if not 400 <= resp.status <= 599:
                # a redirect, an empty 204, a 1xx that is no interim answer: neither the
                # answer nor an error, and the caller must not get it as its status
                resp.close()
                odd = MalformedResponse(
                    f"the upstream answered with HTTP status {resp.status}, which is neither "
                    "a chat completion nor an error"
                )
                self.log(odd.http_status, odd.code)
                raise odd
            try:
                raw = await read_body(resp)
            except ResponseTooLarge as exc:  # an error body past the limits
                self.log(exc.http_status, exc.code)
                raise
            error = self._upstream.error_from_response(resp.status, raw, resp.headers)
            await self.again_or_raise(error, resp.headers)

    async def _failed_over(self) -> bool:
        """Whether the request now goes to another server of the pool, its own being down."""
        if self._server is None:
            return False
        root = await self._server.moved_root()
        if root is None:
            return False
        self._root = root
        self._to = _host_port(root)
        self._headers = self._headers_there()
        self._log.retried = True
        self._log.next_kind = "failover"
        return True

    async def again_or_raise(
        self, error: GatewayError, headers: Mapping[str, str] | None = None
    ) -> None:
        """Log the failed attempt; wait and return if it is to be sent again, else raise."""
        self.log(error.http_status, error.code)
        headers = headers or {}
        decision = decide(
            status=error.http_status,
            code=error.code,
            retryable=error.retryable,
            headers=headers,
            attempt=self._log.count,
            elapsed_s=time.monotonic() - self._started,
            rules=self._upstream.retry_rules,
            budget=self._upstream.retry_budget,
        )
        if not decision.retry:
            # the upstream's wish, as a number of seconds: its own text is never relayed
            wait_s = retry_after_s(headers)
            if wait_s is not None:
                error.headers["retry-after"] = str(min(math.ceil(wait_s), RETRY_AFTER_CAP_S))
            raise error
        await self._sleep(decision.delay_s)
