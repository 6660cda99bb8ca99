"""Run an ASGI app with uvicorn in a background thread, on 127.0.0.1 and a free port.

Owns only the server's lifecycle (start, wait until listening, stop). It knows nothing
about what the app does. The thread gets its own event loop, so tests may use any client:
blocking (`http.client`, the `openai` SDK) or asynchronous (`aiohttp` in pytest-asyncio).

Usage::

    with serve_in_thread(fake.app) as srv:
        http.client.HTTPConnection("127.0.0.1", srv.port)
        ...

or ``srv = serve_in_thread(app)`` … ``srv.stop()``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Generator, MutableMapping
from types import TracebackType
from typing import Any, Literal

import uvicorn

# uvicorn hands every app a dict scope
ASGIApp = Callable[
    [
        dict[str, Any],
        Callable[[], Awaitable[MutableMapping[str, Any]]],
        Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ],
    Awaitable[None],
]

HOST = "127.0.0.1"


class _ThreadServer(uvicorn.Server):
    """A uvicorn server that never touches signal handlers (only the main thread may)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    def install_signal_handlers(self) -> None:  # older uvicorn releases call this instead
        return None


class RunningServer:
    """A started server: its address, and `stop()` to shut it down and join its thread."""

    def __init__(
        self, server: _ThreadServer, thread: threading.Thread, port: int, scheme: str = "http"
    ) -> None:
        self._server = server
        self._thread = thread
        self.port = port
        self.host = HOST
        self.url = f"{scheme}://{HOST}:{port}"

    def stop(self, timeout: float = 10.0) -> None:
        """Ask uvicorn to exit, then join the thread; force the exit if it lingers."""
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            # A client still holding a stream open would otherwise keep shutdown waiting.
            self._server.force_exit = True
            self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"fake server on port {self.port} did not stop")

    @property
    def running(self) -> bool:
        """True while the server thread is alive."""
        return self._thread.is_alive()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve_in_thread(
    app: ASGIApp,
    *,
    timeout_keep_alive: int = 5,
    startup_timeout: float = 10.0,
    lifespan: Literal["auto", "on", "off"] = "off",
    http: Any = "httptools",
    tls: tuple[str, str] | None = None,
) -> RunningServer:
    """Start `app` on 127.0.0.1:<free port> in a daemon thread and return once it listens.

    `timeout_keep_alive` defaults to 5 s, the idle keep-alive limit of llama-server's HTTP
    layer, so connection-reuse behaviour matches the real upstream.
    """
    config = uvicorn.Config(
        app,
        host=HOST,
        port=0,
        loop="asyncio",
        http=http,
        lifespan=lifespan,
        interface="asgi3",  # bound methods are not detected as ASGI3 by uvicorn's sniffing
        log_level="warning",
        log_config=None,  # no dictConfig: leave global logging (and pytest's capture) alone
        access_log=False,
        server_header=False,  # the app sets its own `Server` header
        timeout_keep_alive=timeout_keep_alive,
        timeout_graceful_shutdown=2,
        ssl_certfile=tls[0] if tls else None,
        ssl_keyfile=tls[1] if tls else None,
    )
    server = _ThreadServer(config)
    thread = threading.Thread(target=server.run, name="fake-upstream", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(startup_timeout)
            raise RuntimeError("fake server failed to start")
        time.sleep(0.005)
    port = int(server.servers[0].sockets[0].getsockname()[1])
    return RunningServer(server, thread, port, "https" if tls else "http")


def stop_all(servers: list[RunningServer]) -> None:
    """Stop several servers at once: all are asked to exit before any is joined."""
    for srv in servers:
        srv._server.should_exit = True
    for srv in servers:
        srv.stop()
