"""One managed llama-server process: start on a free loopback port, wait until healthy,
restart with backoff when it dies, stop with the gateway.

Owns the process and its state; it must not know chat payloads. Each start gives
the server a fresh key and an environment reduced to what it needs
(``environment.py``); everything the gateway sends it carries ``auth_headers()``. The
child is put in its own session (a Ctrl-C meant for the gateway does not hit it first)
and asked to die with the gateway (PR_SET_PDEATHSIG), so no server outlives it. Its
log, which holds what the server prints of prompts, is the gateway user's alone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from boundedcode_gateway import private_files
from boundedcode_gateway.errors import GatewayError, UpstreamUnavailable
from boundedcode_gateway.llama_server.api import LlamaServerAPI, ServerRefused
from boundedcode_gateway.llama_server.environment import new_api_key, server_environment
from boundedcode_gateway.llama_server.flags import LOOPBACK, ServerCommand, shown_argv
from boundedcode_gateway.upstream.http import HttpClient

log = logging.getLogger(__name__)

HEALTH_POLL_S = 0.1
STOP_GRACE_S = 10.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
# a run this long counts as healthy: the next death starts the backoff afresh
HEALTHY_RUN_S = 60.0
_PR_SET_PDEATHSIG = 1


ServerState = Literal["starting", "ready", "restarting", "failed", "stopped"]


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """What an operator is shown of one managed server."""

    state: ServerState
    pid: int | None
    port: int | None
    # seconds since it last became ready (None unless ready)
    uptime_s: float | None
    restarts: int
    # its command line, values of secret-looking flags hidden
    argv: tuple[str, ...]


# the ports lately given to servers this process starts: a server binds its port a
# moment after it is chosen, and until then the OS may hand the same port out again
_RECENT_PORTS: collections.deque[int] = collections.deque(maxlen=64)
_PORT_TRIES = 100


def _port_the_os_gives() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def free_port() -> int:
    """A port on the loopback interface that nothing listens on right now and that no
    server started lately by this process was given."""
    for _ in range(_PORT_TRIES):
        port = _port_the_os_gives()
        if port not in _RECENT_PORTS:
            _RECENT_PORTS.append(port)
            return port
    raise OSError(f"no free port on {LOOPBACK} in {_PORT_TRIES} tries")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ManagedLlamaServer:
    """The llama-server of one model profile, kept running while the gateway runs."""

    def __init__(
        self,
        name: str,
        command_for_port: Callable[[int], ServerCommand],
        log_path: Path,
        startup_timeout_s: float,
        http: HttpClient,
    ) -> None:
        self.name = name
        self._command_for_port = command_for_port
        self._log_path = log_path
        self._startup_timeout_s = startup_timeout_s
        # its key alone lets a request in, whatever the profile's own
        self._api = LlamaServerAPI(http, lambda root: self.auth_headers())
        self._proc: subprocess.Popen[bytes] | None = None
        self._port = 0
        self._ready = asyncio.Event()
        self._stopping = False
        self._supervisor: asyncio.Task[None] | None = None
        self.restarts = 0
        self._state: ServerState = "stopped"
        self._ready_since: float | None = None  # monotonic
        self._argv: tuple[str, ...] = ()
        # the key of the server's current start (none before the first)
        self._key: str | None = None
        # told each time the server is ready again after it exited (its cache empty)
        self.on_restart: Callable[[], None] | None = None

    def auth_headers(self) -> dict[str, str]:
        """What a request to the server's current start carries to be let in."""
        return {"Authorization": f"Bearer {self._key}"} if self._key is not None else {}

    def serves(self, url: str) -> bool:
        """Whether ``url`` is on the server's current port (an earlier start's port is not:
        its key went with it)."""
        if not self._port:
            return False
        root = f"http://{LOOPBACK}:{self._port}"
        return url == root or url.startswith(root + "/")

    def status(self) -> ServerStatus:
        ready_since = self._ready_since
        return ServerStatus(
            self._state,
            self.pid if self._state != "stopped" else None,
            self._port or None,
            round(time.monotonic() - ready_since, 1) if ready_since is not None else None,
            self.restarts,
            shown_argv(self._argv),
        )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``; a 503 while the server is starting or restarting."""
        if not self._ready.is_set():
            state = "restarting" if self.restarts else "starting"
            raise UpstreamUnavailable(
                f"the llama-server of model '{self.name}' is {state}; try again shortly"
            )
        return f"http://{LOOPBACK}:{self._port}"

    async def start(self) -> None:
        """Start supervising; return when the server first answers ``/health`` (or times out)."""
        if self._supervisor is None:
            self._supervisor = asyncio.get_running_loop().create_task(self._supervise())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), self._startup_timeout_s)
        if not self._ready.is_set():
            self._state = "failed"
            log.error(
                "llama-server for %s is not healthy after %.0f s; see %s",
                self.name,
                self._startup_timeout_s,
                self._log_path,
            )

    async def _supervise(self) -> None:
        backoff = BACKOFF_FIRST_S
        while not self._stopping:
            started = time.monotonic()
            code = await self._run_once()
            if self._stopping:
                return
            if time.monotonic() - started > HEALTHY_RUN_S:
                backoff = BACKOFF_FIRST_S
            self.restarts += 1
            log.warning(
                "llama-server for %s exited with %s; restarting in %.1f s", self.name, code, backoff
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _run_once(self) -> int | None:
        self._port = free_port()
        cmd = self._command_for_port(self._port)
        self._argv = cmd.argv
        self._key = new_api_key()
        env = server_environment(os.environ, cmd.env, self._key, cmd.pass_env)
        if self._state != "failed":
            self._state = "restarting" if self.restarts else "starting"
        private_files.make_folder(self._log_path.parent)
        with private_files.open_append(self._log_path) as out:
            self._proc = subprocess.Popen(
                cmd.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        proc = self._proc
        log.info("llama-server for %s: pid %d on port %d", self.name, proc.pid, self._port)
        exited = asyncio.ensure_future(asyncio.to_thread(proc.wait))
        try:
            await self._wait_healthy(exited)
            return await exited
        finally:
            # a run that never became ready leaves the server failed until one does
            if not self._stopping:
                self._state = "restarting" if self._ready.is_set() else "failed"
            self._ready_since = None
            self._ready.clear()
            if not exited.done():
                exited.cancel()

    async def _wait_healthy(self, exited: asyncio.Future[int]) -> None:
        root = f"http://{LOOPBACK}:{self._port}"
        while not exited.done() and not self._stopping:
            try:
                await self._api.health(root)
            except (GatewayError, ServerRefused):
                pass  # not listening yet, or still loading its model
            else:
                self._state = "ready"
                self._ready_since = time.monotonic()
                self._ready.set()
                if self.restarts and self.on_restart is not None:
                    self.on_restart()
                return
            await asyncio.sleep(HEALTH_POLL_S)

    async def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after a grace period) and its supervisor."""
        self._stopping = True
        self._ready.clear()
        self._state = "stopped"
        self._ready_since = None
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                await asyncio.wait_for(asyncio.to_thread(proc.wait), STOP_GRACE_S)
            except TimeoutError:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
