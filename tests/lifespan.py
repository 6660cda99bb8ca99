"""Driving an app's ASGI lifespan by hand, as uvicorn does: what it reports of its start."""

from __future__ import annotations

from typing import Any

from boundedcode_gateway.app import GatewayApp


async def startup_report(app: GatewayApp) -> dict[str, Any]:
    """The one message the app's lifespan sends for ``lifespan.startup`` (then it is shut
    down, whatever it said)."""
    sent: list[dict[str, Any]] = []
    messages = iter([{"type": "lifespan.startup"}])

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: Any) -> None:
        sent.append(message)

    try:
        await app({"type": "lifespan"}, receive, send)
    finally:
        await app.shutdown()
    [report] = sent
    return report
