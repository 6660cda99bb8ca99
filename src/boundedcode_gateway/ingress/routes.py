"""The router, as plain ASGI: each request's route found in the table, its checks made,
its handler run, and any refusal answered in the shape of the caller's front.

The checks come in one order for every route but ``/health``: where the request comes
from (``access/sites.py``), then who sends it (``access/``), then its method. The
surfaces each have a module: the calls of the fronts (``calls.py``), the models
(``models.py``), the operator's endpoints (``operations.py``) and the page of calls
(``page.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from boundedcode_gateway.asgi.body import BodyParser
from boundedcode_gateway.asgi.body_read import ReadingBudget
from boundedcode_gateway.asgi.render import Receive, Send, send_error, send_json
from boundedcode_gateway.call_context import Caller
from boundedcode_gateway.config import LimitsSettings
from boundedcode_gateway.errors import (
    BodiesOverBudget,
    BodyTooLarge,
    BodyTooSlow,
    GatewayError,
    MethodNotAllowed,
    NotFound,
    internal_error,
)
from boundedcode_gateway.fronts.base import CHAT, Front
from boundedcode_gateway.ingress.calls import Calls
from boundedcode_gateway.ingress.headers import access_headers, header
from boundedcode_gateway.ingress.models import Models
from boundedcode_gateway.ingress.operations import Operations
from boundedcode_gateway.ingress.page import Page
from boundedcode_gateway.ingress.table import Access, Request, Route, RouteTable
from boundedcode_gateway.live_config import LiveConfig
from boundedcode_gateway.operations.failure_log import FailureLog
from boundedcode_gateway.operations.metrics import GatewayMetrics
from boundedcode_gateway.service import GatewayService
from boundedcode_gateway.ui.routes import UiRoutes

# liveness: answered to anyone, before any check (it tells nothing)
HEALTH_PATHS = ("/health", "/v1/health")
# Anthropic's SDKs send the key here: taken by the other fronts when Authorization is absent
API_KEY_HEADER = b"x-api-key"
# the front where x-api-key wins over Authorization (Anthropic's rule)
KEY_FIRST_FRONT = "messages"


def _credential(
    scope: dict[str, Any], front: Front | None, authorization: str | None
) -> str | None:
    """The caller's key as a Bearer credential. A call of a front other than chat's may
    give it as ``x-api-key`` (where Anthropic's SDKs sent it before their 2026-10-21
    majors, which send ``Authorization: Bearer``): taken when Authorization is absent,
    and on the Messages front, as Anthropic does, in its place when both come."""
    if front is None or front is CHAT:
        return authorization
    key = header(scope, API_KEY_HEADER)
    if key is None or (authorization is not None and front.name != KEY_FIRST_FRONT):
        return authorization
    return "Bearer " + key


def _login(
    live: LiveConfig, route: Route, scope: dict[str, Any], authorization: str | None
) -> Caller | None:
    """Who sends the request (None without ``auth:``); a browser opening the page may
    give the key as HTTP Basic's password."""
    authenticator = live.authenticator
    if authenticator is None:
        return None
    login = authenticator.viewer if route.access is Access.VIEWER else authenticator.caller
    return login(_credential(scope, route.front, authorization))


async def _health(request: Request) -> None:
    await send_json(request.send, 200, b'{"status":"ok"}')


async def _not_found(request: Request) -> None:
    raise NotFound(f"Unknown path: {request.scope['method']} {request.path}")


class Router:
    """Dispatches HTTP requests to the handlers of the route table."""

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
        # the fronts by their call's path (fronts/registry.py)
        self.fronts = fronts if fronts is not None else {"/v1/chat/completions": CHAT}
        self.metrics = metrics
        self.ui = ui
        self.body_parser = body_parser or BodyParser(LimitsSettings().max_parsing_bytes)
        self.calls = Calls(
            service,
            self.body_parser,
            reading or ReadingBudget(LimitsSettings().max_reading_bytes),
            failures,
        )
        self.models = Models(service)
        self.operations = Operations(service, metrics)
        health = Route(_health, access=Access.PUBLIC)
        self.table = RouteTable(
            [
                *((path, health) for path in HEALTH_PATHS),
                *(Page(service, ui).routes() if ui is not None else ()),
                *self.calls.routes(self.fronts),
                *self.operations.routes(),
                *self.models.routes(),
            ],
            fallback=Route(_not_found),
        )

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        route, params = self.table.match(path)
        # one configuration for the whole request, whatever a reload does meanwhile
        live = self.service.live
        if route.access is Access.PUBLIC:
            await route.handler(
                Request(scope, receive, send, params, live, None, None, None, None, None)
            )
            return
        front = route.front
        # a call's own refusals, once its handler runs, are told by the handler
        handling = False
        try:
            host, origin, authorization, content_type = access_headers(scope)
            live.sites.check(host, origin)
            caller = _login(live, route, scope, authorization)
            if route.methods is not None and method not in route.methods:
                raise MethodNotAllowed(f"Use {' or '.join(sorted(route.methods))} for {path}")
            handling = True
            await route.handler(
                Request(
                    scope,
                    receive,
                    send,
                    params,
                    live,
                    caller,
                    host,
                    origin,
                    authorization,
                    content_type,
                )
            )
        except (BodyTooLarge, BodyTooSlow, BodiesOverBudget) as exc:
            # the rest of the body is not read: the connection cannot carry another request
            await send_error(send, exc, close=True, front=front)
        except GatewayError as exc:
            self._unrecorded(front, exc, told=handling)
            await send_error(send, exc, front=front)
        except Exception:
            # a fault outside a call's own handling (a chat call records its own)
            error = internal_error(f"{method} {path}")
            self._unrecorded(front, error)
            await send_error(send, error, front=front)

    def _unrecorded(self, front: Front | None, exc: GatewayError, told: bool = False) -> None:
        """A call refused without a record (``front``: None for a request that is not a
        call): its line on stderr all the same, unless ``told`` already."""
        if front is not None and not told:
            self.calls.unrecorded(front, exc)
