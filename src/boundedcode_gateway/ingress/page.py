"""The page of calls (``ui/``) in the table: ``/ui`` and everything under it, for a
viewer the page lets in; the page answers the rest itself, its methods included."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from boundedcode_gateway.ingress.table import Access, Request, Route
from boundedcode_gateway.service import GatewayService
from boundedcode_gateway.ui.routes import UI_PREFIX, UiRoutes


class Page:
    def __init__(self, service: GatewayService, ui: UiRoutes) -> None:
        self.service = service
        self.ui = ui

    def routes(self) -> Iterator[tuple[str, Route]]:
        route = Route(self._serve, access=Access.VIEWER)
        yield UI_PREFIX, route
        yield UI_PREFIX + "/{page:path}", route

    async def _serve(self, request: Request) -> None:
        self.ui.check_access(request.live.config.ui, request.caller)
        await self.ui(request.scope, request.receive, request.send, self._readmits(request))

    def _readmits(self, request: Request) -> Callable[[], bool]:
        """Whether the page's request would be let in by the configuration in force now:
        the router's checks and the page's, asked again after a reload of an event stream
        still open."""
        host, origin, authorization = request.host, request.origin, request.authorization

        def admitted() -> bool:
            live = self.service.live
            try:
                live.sites.check(host, origin)
                authenticator = live.authenticator
                caller = authenticator.viewer(authorization) if authenticator else None
                self.ui.check_access(live.config.ui, caller)
            except Exception:
                # a refusal, or any fault in asking: the stream is ended, not kept open
                return False
            return True

        return admitted
