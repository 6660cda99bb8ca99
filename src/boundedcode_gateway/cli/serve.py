"""``boundedcode-gateway serve``: run the gateway under uvicorn until SIGINT/SIGTERM;
SIGHUP reloads the configuration."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Iterator

import uvicorn

from boundedcode_gateway.access.listen import listen_refusal
from boundedcode_gateway.access.sites import DEFAULT_LISTEN_HOST
from boundedcode_gateway.app import GatewayApp, create_app
from boundedcode_gateway.config import ConfigSource, GatewayConfig
from boundedcode_gateway.ingress.server import protocol_for

DEFAULT_HOST = DEFAULT_LISTEN_HOST
DEFAULT_PORT = 8780
# serving was refused before anything started (the configuration does not allow it)
EXIT_REFUSED = 2
# the gateway could not start serving (its port taken, or its start failed)
EXIT_NOT_LISTENING = 1
# in-flight calls get this long to finish (and be recorded) after a stop signal
GRACEFUL_SHUTDOWN_S = 30


def _loop() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


class _GatewayServer(uvicorn.Server):
    """uvicorn, but a stop signal ends the process with status 0 once shutdown is done,
    and SIGHUP reloads the gateway's configuration."""

    def __init__(self, config: uvicorn.Config, app: GatewayApp) -> None:
        super().__init__(config)
        self.app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # the page of calls' event streams never end on their own: ended first, they do not
        # hold the calls' grace period open
        self.app.events.close_viewers()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises the captured signal after shutdown, which would turn a clean
        # stop into a death by signal; the first signal drains, a second one forces
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        # runs inside the server's loop: the reload starts as a task on it
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(RELOAD_SIGNAL, self.app.reload_soon)
        try:
            yield
        finally:
            loop.remove_signal_handler(RELOAD_SIGNAL)
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, not yet listening: callers are refused until the
    gateway has started and uvicorn listens on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family)
    try:
        # as uvicorn binds (its Config.bind_socket would end the process on failure): a
        # port left in TIME_WAIT by the previous run is taken again
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
RELOAD_SIGNAL = signal.SIGHUP


def run_serve(
    config: GatewayConfig,
    host: str,
    port: int,
    source: ConfigSource | None = None,
    insecure_no_auth: bool = False,
) -> int:
    """Serve until stopped; uvicorn turns SIGINT/SIGTERM into a graceful shutdown, and
    SIGHUP reads ``source`` again.

    Off the loopback interface only with ``auth:`` (or ``--insecure-no-auth``).
    """
    refusal = listen_refusal(host, config.auth, insecure_no_auth)
    if refusal is not None:
        print(f"boundedcode-gateway serve: {refusal}", file=sys.stderr)
        return EXIT_REFUSED
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # the port is held before the lifespan starts managed llama-servers on ports of their
    # own: a port the OS hands out (bind to 0) can otherwise be the one given here
    try:
        listener = listening_socket(host, port)
    except OSError as exc:
        print(f"boundedcode-gateway serve: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return EXIT_NOT_LISTENING
    app = create_app(config, source, listen_host=host)
    server = _GatewayServer(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            loop=_loop(),
            # uvicorn's httptools protocol, its writes gathered per loop turn, with the
            # connection limits of `limits:` (its keep-alive timeout among them) and a
            # caller that stops reading cut off
            http=protocol_for(config.limits, config.inference.write_stall_s),
            lifespan="on",
            # no route speaks WebSocket: an upgrade is served as plain HTTP, never handed
            # to a protocol whose scope no route takes (a text/plain 500)
            ws="none",
            access_log=False,
            # no `server: uvicorn` on every answer: what the gateway runs on is no
            # caller's business (and a guide to its known flaws)
            server_header=False,
            # the gateway never reads the caller's address: no X-Forwarded-* rewriting
            # middleware on every request
            proxy_headers=False,
            log_level="info",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        ),
        app,
    )
    with listener:
        server.run(sockets=[listener])
    return 0 if server.started else EXIT_NOT_LISTENING
