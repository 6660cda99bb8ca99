"""The picture of docs/observability.md: a task's call through the gateway, its answer
broken once and sent again, as Phoenix shows it.

    .venv/bin/python -m tests.receivers.gateway_trace docs/images/observability-trace.png

Phoenix from ``make receivers``, the fake llama-server of the tests, Debian's Chromium.
"""

from __future__ import annotations

import sys
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx
import yaml

from boundedcode_gateway.app import create_app
from boundedcode_gateway.config import parse_config
from boundedcode_gateway.unique_ids import hex_id
from tests.fakes.common import Reply
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import serve_in_thread
from tests.receivers.phoenix import Phoenix
from tests.receivers.screenshot import trace_screenshot

ANSWER = "A hash map doubles its table when it grows and moves each entry to its new bucket."


def main(out: Path) -> None:
    with Phoenix() as phoenix, TemporaryDirectory() as data:
        llama = FakeLlamaServer()
        upstream = serve_in_thread(llama.app)
        config = {
            "data_dir": data,
            "observability": {"endpoint": phoenix.otlp_http_endpoint, "metrics": False},
            "models": {"local": {"provider": "local", "external_url": upstream.url}},
        }
        app = create_app(parse_config(yaml.safe_dump(config)), listen_host="127.0.0.1")
        gateway = serve_in_thread(app, lifespan="on")
        try:
            llama.queue(Reply(content=ANSWER, break_after_chunks=2), Reply(content=ANSWER))
            trace_id = hex_id(128)
            headers = {
                "traceparent": f"00-{trace_id}-{hex_id(64)}-01",
                "X-BoundedCode-Task": "hash-map",
            }
            body = {
                "model": "local",
                "stream": True,
                "messages": [{"role": "user", "content": "How does a hash map grow?"}],
            }
            httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers).read()
            assert app.bus.flush(10.0)
            assert app.observability.export is not None and app.observability.export.flush(10)
            phoenix.spans(trace_id=trace_id, wait_for=3)
            trace_screenshot(phoenix.ui_url, "default", trace_id, out)
        finally:
            gateway.stop()
            upstream.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
