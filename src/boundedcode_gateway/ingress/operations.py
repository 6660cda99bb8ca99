"""The operator's endpoints: ``/metrics`` (Prometheus' text format) and ``/ready`` (200,
or 503 naming each profile that is not ready and why); with ``auth:``, for an admin key
only, with any method."""

from __future__ import annotations

from collections.abc import Iterator

import orjson

from boundedcode_gateway.asgi.render import send_body, send_json
from boundedcode_gateway.errors import Forbidden
from boundedcode_gateway.ingress.table import Request, Route
from boundedcode_gateway.operations.metrics import GatewayMetrics
from boundedcode_gateway.operations.readiness import readiness
from boundedcode_gateway.service import GatewayService


class Operations:
    def __init__(self, service: GatewayService, metrics: GatewayMetrics) -> None:
        self.service = service
        self.metrics = metrics

    def routes(self) -> Iterator[tuple[str, Route]]:
        yield "/metrics", Route(self._metrics)
        yield "/ready", Route(self._ready)

    async def _metrics(self, request: Request) -> None:
        _admin_only(request)
        body, content_type = self.metrics.exposition()
        await send_body(request.send, 200, body, content_type.encode("latin-1"))

    async def _ready(self, request: Request) -> None:
        _admin_only(request)
        ready = await readiness(self.service.upstreams)
        await send_json(request.send, ready.status, orjson.dumps(ready.to_json()))


def _admin_only(request: Request) -> None:
    caller = request.caller
    if caller is not None and not caller.admin:
        raise Forbidden(f"{request.path} is for an admin key", code="admin_required")
