"""``/ui/``: the page's files and its read-only data, as plain ASGI.

Who may see it is decided before anything is read: ``ui: false`` hides it; with
``auth:`` only an admin key opens it (sent as a Bearer token, or as the password of
HTTP Basic, which a browser asks for itself); without ``auth:`` it is served only
when the gateway listens on loopback. The ledger is read in a thread, one short-lived
read-only connection per question, so a slow query never holds up a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any, TypeVar

import orjson

from boundedcode_gateway.access.sites import is_loopback
from boundedcode_gateway.asgi.render import Receive, Send, send_body, send_json
from boundedcode_gateway.call_context import Caller
from boundedcode_gateway.errors import Forbidden, GatewayError, MethodNotAllowed, NotFound
from boundedcode_gateway.locations import LedgerLocation
from boundedcode_gateway.metering.ledgers import LedgerStore, ledger_at, ledger_exists
from boundedcode_gateway.metering.records import CALL_LOG_ONLY
from boundedcode_gateway.providers.base import Upstream
from boundedcode_gateway.service import GatewayService
from boundedcode_gateway.ui.events import CallEvents, Viewer
from boundedcode_gateway.ui.queries import call_filter, page_cursor, task_search
from boundedcode_gateway.ui.records import RecentRecords, logged_records

log = logging.getLogger(__name__)

T = TypeVar("T")

UI_PREFIX = "/ui"
API_PREFIX = "/ui/api/"
# a comment on an idle event stream this often, so proxies and browsers keep it open
KEEP_ALIVE_S = 15.0
# a viewer's events are sent at most this often, the ones of the interval in one write:
# a busy gateway's events cost one send per viewer per interval, not one per event
SEND_EVERY_S = 0.05
_CONTENT_TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".svg": b"image/svg+xml",
    ".txt": b"text/plain; charset=utf-8",
}
# the page loads nothing from elsewhere and cannot be framed by another site
_PAGE_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]
_EVENT_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class UiRoutes:
    """The page's files, its data endpoints and its event stream."""

    def __init__(
        self,
        service: GatewayService,
        events: CallEvents,
        records: RecentRecords,
        calls_path: Path,
        ledger: LedgerLocation | None,
        listen_host: str,
    ) -> None:
        self._service = service
        self._events = events
        self._records = records
        self._calls_path = calls_path
        # None: metering is off, nothing was recorded
        self._ledger = ledger
        self._loopback = is_loopback(listen_host)
        self._files = _static_files()

    def check_access(self, enabled: bool, caller: Caller | None) -> None:
        """Hidden when off; an admin key's with ``auth:``; loopback's only without."""
        if not enabled:
            raise NotFound("the page of calls is turned off (ui: false)")
        if caller is not None:
            if not caller.admin:
                raise Forbidden("the page of calls is for an admin key", code="admin_required")
            return
        if not self._loopback:
            raise Forbidden(
                "the page of calls is served off loopback only with auth: and an admin key",
                code="ui_loopback_only",
            )

    async def __call__(
        self,
        scope: dict[str, Any],
        receive: Receive,
        send: Send,
        admitted: Callable[[], bool] | None = None,
    ) -> None:
        """Answer one request of the page; ``admitted``: whether its credential would be
        let in now, asked after each reload to end an event stream it no longer opens."""
        path: str = scope["path"]
        if scope["method"] != "GET":
            raise MethodNotAllowed(f"Use GET for {path[:200]}")
        if path == UI_PREFIX:
            await send(
                {
                    "type": "http.response.start",
                    "status": 308,
                    "headers": [(b"location", b"/ui/"), (b"content-length", b"0")],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        if path.startswith(API_PREFIX):
            await self._api(scope, receive, send, path[len(API_PREFIX) :], admitted)
            return
        name = path[len(UI_PREFIX) + 1 :] or "index.html"
        found = self._files.get(name)
        if found is None:
            raise NotFound(f"no such page: {path[:200]}")
        body, content_type = found
        await send_body(send, 200, body, content_type, _PAGE_HEADERS)

    # -- the data

    async def _api(
        self,
        scope: dict[str, Any],
        receive: Receive,
        send: Send,
        name: str,
        admitted: Callable[[], bool] | None,
    ) -> None:
        query: bytes = scope.get("query_string", b"")
        if name == "events":
            await self._event_stream(receive, send, admitted)
            return
        if name == "calls":
            out: Any = await self._calls(query)
        elif name.startswith("calls/"):
            out = await self._call(name[len("calls/") :])
        elif name == "tasks":
            out = await self._tasks(query)
        elif name == "models":
            out = await self._models()
        elif name == "limits":
            out = await self._service.limits_view()
        else:
            raise NotFound(f"no such endpoint: /ui/api/{name[:100]}")
        await send_json(send, 200, orjson.dumps(out), _PAGE_HEADERS[1:])

    async def _calls(self, query: bytes) -> dict[str, Any]:
        """A page of the ledger's calls; one task's (its timeline) with the call log's
        detail too: where each prompt stopped matching, the attempts, the adjustments."""
        f = call_filter(query)
        found = await self._read(lambda ledger: ledger.calls(f))
        rows, cursor = found if found is not None else ([], None)
        if f.task is not None and rows:
            await self._add_detail(rows)
        return {"calls": rows, "next": page_cursor(cursor), "metering": self._metering}

    async def _add_detail(self, rows: list[dict[str, Any]]) -> None:
        missing: list[str] = []
        for row in rows:
            detail = self._records.detail(row["call_id"])
            if detail is None:
                missing.append(row["call_id"])
            else:
                row.update(detail)
        if not missing:
            return
        logged = await asyncio.to_thread(logged_records, self._calls_path, missing)
        for row in rows:
            line = logged.get(row["call_id"])
            if line is not None:
                row.update({name: line.get(name) for name in CALL_LOG_ONLY})

    async def _call(self, call_id: str) -> dict[str, Any]:
        """The whole record: kept in memory, else the call log's, else the ledger's row."""
        record = self._records.get(call_id)
        if record is None:
            logged = await asyncio.to_thread(logged_records, self._calls_path, [call_id])
            record = logged.get(call_id)
        if record is None:
            record = await self._read(lambda ledger: ledger.call(call_id))
        if record is None:
            raise NotFound(f"no call {call_id[:100]} in the call log or the ledger")
        return record

    async def _tasks(self, query: bytes) -> dict[str, Any]:
        search, limit = task_search(query)
        tasks = await self._read(lambda ledger: ledger.tasks(search, limit))
        return {"tasks": tasks or [], "metering": self._metering}

    async def _models(self) -> dict[str, Any]:
        service = self._service
        upstreams = list(service.upstreams.items())
        shown = await asyncio.gather(*(_model(name, u, service) for name, u in upstreams))
        return {"models": shown}

    @property
    def _metering(self) -> bool:
        return self._ledger is not None

    async def _read(self, question: Callable[[LedgerStore], T]) -> T | None:
        """Ask the ledger in a thread; None when there is none (yet)."""
        location = self._ledger
        if location is None:
            return None
        return await asyncio.to_thread(_ask_ledger, location, question)

    # -- the event stream

    async def _event_stream(
        self, receive: Receive, send: Send, admitted: Callable[[], bool] | None
    ) -> None:
        viewer = self._events.join(admitted)
        if viewer is None:
            raise GatewayError(
                "too many viewers of the page of calls; close one",
                code="too_many_viewers",
                status=429,
                error_type="rate_limit_error",
            )
        gone = asyncio.ensure_future(_until_disconnect(receive))
        gone.add_done_callback(lambda _: viewer.close())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _EVENT_HEADERS})
            while not viewer.closed:
                await self._send_events(send, viewer)
        except OSError:
            pass  # the viewer's connection is gone
        finally:
            gone.cancel()
            self._events.leave(viewer)
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _send_events(send: Send, viewer: Viewer) -> None:
        if await viewer.wait(KEEP_ALIVE_S):
            if not viewer.closed:
                await asyncio.sleep(SEND_EVERY_S)
            body = b"".join(viewer.take())
            if not body:
                return  # closed
        else:
            body = b": keep-alive dropped=" + str(viewer.dropped).encode() + b"\n\n"
        await send({"type": "http.response.body", "body": body, "more_body": True})


async def _model(name: str, upstream: Upstream, service: GatewayService) -> dict[str, Any]:
    """One profile as the models view shows it: what it is, can do, and runs on."""
    try:
        caps: dict[str, Any] | None = (await upstream.capabilities()).to_json()
    except GatewayError:
        caps = None
    return {
        "name": name,
        "provider": upstream.provider,
        "upstream_model": upstream.upstream_model,
        "capabilities": caps,
        "not_ready": await upstream.readiness(),
        # a cloud API's: none
        "servers": await service.servers_of(name) or [],
    }


def _ask_ledger(location: LedgerLocation, question: Callable[[LedgerStore], T]) -> T | None:
    if not ledger_exists(location):
        return None  # nothing recorded yet
    ledger = ledger_at(location)
    ledger.open(read_only=True)
    try:
        return question(ledger)
    finally:
        ledger.close()


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _static_files() -> dict[str, tuple[bytes, bytes]]:
    """The page's files, read once: name → (bytes, content type)."""
    folder = files("boundedcode_gateway.ui").joinpath("static")
    out: dict[str, tuple[bytes, bytes]] = {}
    for entry in folder.iterdir():
        suffix = Path(entry.name).suffix
        if entry.is_file() and suffix in _CONTENT_TYPES:
            out[entry.name] = (entry.read_bytes(), _CONTENT_TYPES[suffix])
    return out
