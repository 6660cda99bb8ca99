"""A web host of media files on 127.0.0.1, as a raw ASGI app: every GET answers a small
PNG and is written down, so a test sees whether anything fetched a URL it named."""

from __future__ import annotations

from tests.fakes.common import Receive, Scope, Send

# the PNG signature and an empty IHDR's start: enough bytes for a fetch to have happened
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"


class MediaHost:
    """Serve `.app` with `serve_in_thread`; `.paths` holds each request's path."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.paths.append(scope["path"])
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"image/png")],
            }
        )
        await send({"type": "http.response.body", "body": PNG})
