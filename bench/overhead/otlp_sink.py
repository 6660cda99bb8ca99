"""An OTLP/HTTP collector that takes every export and keeps nothing: where the traced
gateway target sends its spans and metrics, so that what is measured is the gateway's
side of the export (the bench's own core runs it, as it runs the fake upstream)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# told of each export: its path (/v1/traces, /v1/metrics) and its body
OnExport = Callable[[str, bytes], None]


class OtlpSink:
    """Serves on 127.0.0.1 until ``close``; counts the exports and their bytes, and hands
    each to ``on_export`` where one is given."""

    def __init__(self, on_export: OnExport | None = None) -> None:
        self.exports = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(size)
                if on_export is not None:
                    on_export(self.path, body)
                sink.exports += 1
                sink.bytes += size
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
