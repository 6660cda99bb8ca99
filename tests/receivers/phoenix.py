"""Arize Phoenix, a real OTLP trace receiver, run as a program for the tests and read back.

`make receivers` installs it in $(RECEIVERS_VENV)/phoenix, never in the gateway's own
environment: Phoenix pins its own OpenTelemetry, FastAPI and SQLAlchemy. ``Phoenix`` runs
``phoenix serve`` on free loopback ports, its SQLite database in a folder of its own, and
reads the stored spans back through Phoenix's REST API
(``GET /v1/projects/{project}/spans``).

Phoenix files a span under a project: the ``x-project-name`` header of an OTLP/HTTP
request if there is one, else the resource attribute ``openinference.project.name``
(``PROJECT_ATTRIBUTE``), else the project ``default``. A project exists from its first
span on. Phoenix takes no OTLP metrics: ``POST /v1/metrics`` answers 405, and its gRPC
port UNIMPLEMENTED.

What a span read back holds of what was exported, as Phoenix 20.26.1 stores it (seen with
opentelemetry-sdk 1.45, the same over OTLP/HTTP and gRPC):

- Attribute values keep their OTLP type: int (the whole int64 range), float (3.0 stays a
  float, 0.1 stays 0.1), bool, str (unicode, 100 kB), and arrays of each, an empty one
  included. Keys come back dotted as sent: Phoenix nests them by their dots in its
  database and joins them again on the way out, and a key that is also another's prefix
  (``a`` and ``a.b``) keeps both.
- A float attribute that is NaN or infinite is dropped, its key with it.
- Phoenix adds attributes: from ``gen_ai.*`` it derives the OpenInference ones
  (``gen_ai.usage.input_tokens`` and ``output_tokens`` also give
  ``llm.token_count.prompt``, ``.completion`` and ``.total``; ``gen_ai.request.model``
  gives ``llm.model_name``; ``gen_ai.system`` gives ``llm.system`` and ``llm.provider``),
  and such a span gets the kind ``LLM``. An exact comparison of a span's attributes must
  leave these out.
- ``openinference.span.kind`` leaves the attributes to become ``span_kind`` ("UNKNOWN"
  when neither sent nor derived). The OTel SpanKind (SERVER, CLIENT...) is not stored.
- A string attribute whose key ends in ``metadata``, ``tool.parameters`` or
  ``llm.prompt_template.variables`` and holds JSON comes back parsed: an object as its
  dotted keys, an array as a list, not as the string.
- Times keep microseconds, not nanoseconds. Links, trace state, the instrumentation scope
  and the resource's attributes (but the project's name) are not stored.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Any
from urllib.parse import quote

import httpx

REPO = Path(__file__).resolve().parents[2]
# the Makefile's RECEIVERS_VENV, relative to the repository's root unless absolute
RECEIVERS_VENV = REPO / os.environ.get("RECEIVERS_VENV", ".venv-receivers")
PHOENIX_PROGRAM = RECEIVERS_VENV / "phoenix" / "bin" / "phoenix"
INSTALL_HINT = "run `make receivers` (a step of `make test`) to install it"

DEFAULT_PROJECT = "default"
PROJECT_ATTRIBUTE = "openinference.project.name"
# OTLP/HTTP only: it outranks the resource attribute; gRPC requests have no such header
PROJECT_HEADER = "x-project-name"

# Its first start runs some hundred migrations on an empty database and imports pandas,
# pyarrow and SQLAlchemy: 10 s on an idle 2-core machine, near 30 s beside a build.
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0
REQUEST_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.2
# the most the REST API gives in one page
PAGE_SIZE = 1000
# a port picked free can be taken by another program before Phoenix binds it
START_ATTEMPTS = 3
BIND_FAILURES = ("address already in use", "failed to bind")


class Phoenix:
    """``phoenix serve`` on 127.0.0.1, for the length of a ``with`` block."""

    def __init__(
        self, *, program: Path = PHOENIX_PROGRAM, start_timeout_s: float = START_TIMEOUT_S
    ) -> None:
        self._program = program
        self._start_timeout_s = start_timeout_s
        self._folder: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._http_port = 0
        self._grpc_port = 0

    @property
    def otlp_http_endpoint(self) -> str:
        """The base URL for ``OTEL_EXPORTER_OTLP_ENDPOINT``: spans go to ``<it>/v1/traces``."""
        return f"http://127.0.0.1:{self._http_port}"

    @property
    def otlp_grpc_endpoint(self) -> str:
        """OTLP over gRPC, without TLS."""
        return f"http://127.0.0.1:{self._grpc_port}"

    @property
    def ui_url(self) -> str:
        """The web UI, and the REST API under ``/v1``."""
        return f"http://127.0.0.1:{self._http_port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def __enter__(self) -> Phoenix:
        if not self._program.is_file():
            raise AssertionError(f"Phoenix is not installed at {self._program}: {INSTALL_HINT}")
        self._folder = Path(tempfile.mkdtemp(prefix="phoenix-"))
        try:
            self._start(self._folder)
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop()

    def spans(
        self,
        project: str = DEFAULT_PROJECT,
        trace_id: str | None = None,
        wait_for: int = 0,
        timeout_s: float = 20,
    ) -> list[dict[str, Any]]:
        """The spans Phoenix holds in ``project`` (of ``trace_id`` only, if given), earliest
        start first; see ``read_spans`` for their keys.

        Phoenix answers an export before it stores the spans (they are written in batches),
        so a test that has just exported waits: ``wait_for`` polls until at least that many
        spans are there, and fails after ``timeout_s`` saying which it found."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = read_spans(self.ui_url, project, trace_id)
            if len(found) >= wait_for:
                return found
            if time.monotonic() >= deadline:
                where = f"project {project!r}" + (f", trace {trace_id}" if trace_id else "")
                names = [span["name"] for span in found]
                raise AssertionError(
                    f"Phoenix holds {len(found)} span(s) {names} in {where} after "
                    f"{timeout_s} s; {wait_for} awaited"
                )
            time.sleep(POLL_INTERVAL_S)

    def projects(self) -> list[str]:
        """The names of the projects Phoenix has, ``default`` among them from its start."""
        return [project["name"] for project in _pages(self.ui_url, "/v1/projects", {})]

    def _start(self, folder: Path) -> None:
        for attempt in range(START_ATTEMPTS):
            self._http_port, self._grpc_port = _free_ports(2)
            log_path = folder / f"phoenix-{attempt}.log"
            self._log = log_path.open("wb")
            # a session of its own: a Ctrl-C in the terminal reaches pytest alone, which
            # then stops Phoenix by its PID
            self._process = subprocess.Popen(
                [str(self._program), "serve"],
                cwd=folder,
                env=self._environment(folder),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            if self._wait_until_answering(self._process, log_path):
                return
            log = log_path.read_text(errors="replace")
            if not any(failure in log.lower() for failure in BIND_FAILURES):
                raise AssertionError(
                    f"phoenix serve exited ({self._process.returncode}) before it answered; "
                    f"the end of its log:\n{_tail(log)}"
                )
            self._log.close()
        raise AssertionError(f"phoenix serve found its ports taken {START_ATTEMPTS} times")

    def _environment(self, folder: Path) -> dict[str, str]:
        # Phoenix takes its settings from PHOENIX_*, and the OpenTelemetry SDK inside it from
        # OTEL_*: a test's own (an exporter pointed at this Phoenix) must not reach it.
        inherited = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("PHOENIX_", "OTEL_"))
        }
        return {
            **inherited,
            # whatever a library caches under ~ goes with the folder
            "HOME": str(folder),
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self._http_port),
            # Phoenix binds gRPC on every interface ([::]), whatever PHOENIX_HOST says
            "PHOENIX_GRPC_PORT": str(self._grpc_port),
            "PHOENIX_WORKING_DIR": str(folder),
            "PHOENIX_SQL_DATABASE_URL": f"sqlite:///{folder / 'phoenix.db'}",
            "PHOENIX_ENABLE_AUTH": "false",
            # no analytics pixels in the UI, and no request of its own to the internet
            # (web fonts, a sandbox's binary): the tests' machines reach none
            "PHOENIX_TELEMETRY_ENABLED": "false",
            "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
            # endpoints a receiver does not need
            "PHOENIX_ENABLE_MCP_SERVER": "false",
            "PHOENIX_ENABLE_PROMETHEUS": "false",
        }

    def _wait_until_answering(self, process: subprocess.Popen[bytes], log_path: Path) -> bool:
        """True once both ports answer; False if it exits first."""
        deadline = time.monotonic() + self._start_timeout_s
        while process.poll() is None:
            if self._answers():
                return True
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"phoenix serve did not answer within {self._start_timeout_s} s; the end "
                    f"of its log:\n{_tail(log_path.read_text(errors='replace'))}"
                )
            time.sleep(0.25)
        return False

    def _answers(self) -> bool:
        try:
            healthy = httpx.get(
                f"{self.ui_url}/healthz", timeout=REQUEST_TIMEOUT_S, trust_env=False
            ).is_success
            # uvicorn takes requests only after the app's start, the gRPC server's
            # included; a connection proves it all the same
            with socket.create_connection(("127.0.0.1", self._grpc_port), timeout=2):
                pass
        except (httpx.TransportError, OSError):
            return False
        return healthy

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_S)
        if self._log is not None:
            self._log.close()
            self._log = None
        folder, self._folder = self._folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def read_spans(
    ui_url: str, project: str = DEFAULT_PROJECT, trace_id: str | None = None
) -> list[dict[str, Any]]:
    """Every span of ``project`` in the Phoenix at ``ui_url`` (of ``trace_id`` only, if
    given), earliest start first, none if the project does not exist (yet). Each is a dict:

    - ``name``, ``trace_id`` and ``span_id`` (lowercase hex), ``parent_span_id`` (None
      for a root: a span with a remote parent has that parent's id)
    - ``span_kind``: the OpenInference kind (LLM, CHAIN, TOOL... or UNKNOWN), not OTel's
    - ``start_time`` and ``end_time``: aware datetimes in UTC
    - ``status_code`` ("OK", "ERROR" or "UNSET") and ``status_message`` ("" when none)
    - ``attributes``: dotted key to typed value (the module's docstring says what differs)
    - ``events``: dicts of ``name``, ``timestamp`` and ``attributes``
    - ``project``, and ``phoenix_id``: the span's id in Phoenix's UI and GraphQL API
    """
    params: dict[str, str] = {"sort": "start_time", "order": "asc"}
    if trace_id is not None:
        params["trace_id"] = trace_id.lower()
    path = f"/v1/projects/{quote(project, safe='')}/spans"
    try:
        rows = _pages(ui_url, path, params)
    except _ProjectMissing:
        return []
    return [_span(row, project) for row in rows]


def project_id(ui_url: str, project: str) -> str:
    """The project's id in Phoenix's UI (its pages are /projects/<id>/...)."""
    response = _get(ui_url, f"/v1/projects/{quote(project, safe='')}", {})
    if response.status_code == httpx.codes.NOT_FOUND:
        raise AssertionError(f"Phoenix at {ui_url} has no project {project!r}")
    response.raise_for_status()
    return str(response.json()["data"]["id"])


class _ProjectMissing(Exception):
    pass


def _get(ui_url: str, path: str, params: dict[str, str]) -> httpx.Response:
    return httpx.get(ui_url + path, params=params, timeout=REQUEST_TIMEOUT_S, trust_env=False)


def _pages(ui_url: str, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = {**params, "limit": str(PAGE_SIZE), **({"cursor": cursor} if cursor else {})}
        response = _get(ui_url, path, page)
        if response.status_code == httpx.codes.NOT_FOUND:
            raise _ProjectMissing(response.text)
        response.raise_for_status()
        body = response.json()
        rows.extend(body["data"])
        cursor = body.get("next_cursor")
        if not cursor:
            return rows


def _span(row: dict[str, Any], project: str) -> dict[str, Any]:
    end_time = row["end_time"]
    return {
        "name": row["name"],
        "span_kind": row["span_kind"],
        "trace_id": row["context"]["trace_id"],
        "span_id": row["context"]["span_id"],
        "parent_span_id": row["parent_id"],
        "start_time": datetime.fromisoformat(row["start_time"]),
        "end_time": None if end_time is None else datetime.fromisoformat(end_time),
        "status_code": row["status_code"],
        "status_message": row["status_message"],
        "attributes": row["attributes"],
        "events": [
            {
                "name": event["name"],
                "timestamp": datetime.fromisoformat(event["timestamp"]),
                "attributes": event["attributes"],
            }
            for event in row["events"]
        ],
        "project": project,
        "phoenix_id": row["id"],
    }


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 just now (held open together while
    picked, so none is picked twice)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def _tail(log: str, lines: int = 40) -> str:
    return "\n".join(log.splitlines()[-lines:])
