"""``boundedcode-gateway serve``: run the gateway under uvicorn until SIGINT/SIGTERM."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator

import uvicorn

from boundedcode_gateway.app import create_app
from boundedcode_gateway.config import GatewayConfig
from boundedcode_gateway.ingress.server import gathering_protocol

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8780
# in-flight calls get this long to finish (and be recorded) after a stop signal
GRACEFUL_SHUTDOWN_S = 30


def _loop() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


class _GatewayServer(uvicorn.Server):
    """uvicorn, but a stop signal ends the process with status 0 once shutdown is done."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises the captured signal after shutdown, which would turn a clean
        # stop into a death by signal; the first signal drains, a second one forces
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run_serve(config: GatewayConfig, host: str, port: int) -> int:
    """Serve until stopped; uvicorn turns SIGINT/SIGTERM into a graceful shutdown."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    app = create_app(config)
    server = _GatewayServer(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            loop=_loop(),
            # uvicorn's httptools protocol, its writes gathered per loop turn, a caller
            # that stops reading cut off
            http=gathering_protocol(config.inference.write_stall_s),
            lifespan="on",
            access_log=False,
            # the gateway never reads the caller's address: no X-Forwarded-* rewriting
            # middleware on every request
            proxy_headers=False,
            log_level="info",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    )
    server.run()
    return 0 if server.started else 1
