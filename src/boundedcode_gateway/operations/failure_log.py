"""One log line per failed or refused call: what an operator reads first, on stderr.

A call's record is seen as the record bus publishes it (a view, as the metrics
are); a request refused before it had a record (its key, its body unreadable, no model
named) is told by the router. The line is formatted on the event loop, once per such
call, and written by a thread of its own: the request path never waits for stderr. Its
queue is bounded; lines past it are dropped and counted.

Not failures, so not logged: a call that succeeded, a caller that went away
(``client_disconnected``: the gateway did nothing wrong, and its record says so) and
the gateway's own work that gave way to a caller (status ``abandoned``). A caller that
went away before its body was whole has no record (no model was read): it is one line
at ``INFO``, ``call left: ...``, so that uploads that never finished are seen at all.

The line says what went wrong and where, never what was asked: the front, the model
name, the status, the code and the error's message (clipped, control characters
escaped), with the task, the call id, the caller's key name and the provider; never a
key, a token, a header value or the messages.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Iterable

from boundedcode_gateway.errors import CallerLeft, GatewayError
from boundedcode_gateway.metering.meter import CLIENT_CLOSED
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.text import clip, printable

LOGGER_NAME = "boundedcode_gateway.calls"
# what a line keeps of a message, and of a name a caller chose
MESSAGE_CHARS = 300
NAME_CHARS = 128
# lines waiting for the writing thread
MAX_QUEUED_LINES = 10_000

# the thread's item: (level, line); an event to set once the lines before it are written;
# None to stop
_Item = tuple[int, str] | threading.Event | None


def _value(text: str, limit: int = NAME_CHARS) -> str:
    """A value as the line shows it: clipped, printable, quoted when it holds a space, a
    quote or an equals sign (so that ``key=value`` pairs stay apart), a quote in it
    escaped."""
    shown = printable(clip(text, limit))
    if shown and not any(c in shown for c in ' "='):
        return shown
    return '"' + shown.replace('"', '\\"') + '"'


def _pairs(pairs: Iterable[tuple[str, object]]) -> str:
    out = []
    for key, value in pairs:
        if value is None:
            continue
        if isinstance(value, bool):
            shown = "true" if value else "false"
        elif isinstance(value, int):
            shown = str(value)
        else:
            shown = _value(str(value), MESSAGE_CHARS if key == "message" else NAME_CHARS)
        out.append(f"{key}={shown}")
    return " ".join(out)


def is_failure(record: CallRecord) -> bool:
    """Whether a record is of a call that failed or was refused (and so is logged)."""
    if record.status != "error":
        return False
    return not (record.http_status == CLIENT_CLOSED and record.error_code == "client_disconnected")


def failure_line(record: CallRecord) -> tuple[int, str] | None:
    """The level and line of a failed or refused call; None for any other record.

    A 4xx is ``refused`` (a warning: the request, or its caller, was wrong), anything
    else ``failed`` (an error: the gateway or its upstream could not answer, a stream
    that broke after its caller had a 200 among them).
    """
    if not is_failure(record):
        return None
    refused = 400 <= record.http_status < 500
    pairs: list[tuple[str, object]] = [
        ("front", record.front),
        ("model", record.model_profile),
        ("status", record.http_status),
        ("code", record.error_code),
        ("stream", record.stream),
        # the caller had its 200 and part of the answer: the error ended the stream
        ("after_content", True if record.stream and record.ttft_ms is not None else None),
        ("provider", record.provider),
        ("task", record.task),
        ("purpose", record.purpose),
        ("caller", record.caller),
        ("call_id", record.call_id),
        ("message", record.error_message),
    ]
    verb = "refused" if refused else "failed"
    return (logging.WARNING if refused else logging.ERROR), f"call {verb}: {_pairs(pairs)}"


def refusal_line(front: str, exc: GatewayError) -> tuple[int, str]:
    """The level and line of a request refused before it had a record (no model read)."""
    pairs: list[tuple[str, object]] = [
        ("front", front),
        ("status", exc.http_status),
        ("code", exc.code or exc.type),
        ("message", exc.message),
    ]
    if isinstance(exc, CallerLeft):
        level, verb = logging.INFO, "left"  # not a failure: there was no one to answer
    elif exc.http_status < 500:
        level, verb = logging.WARNING, "refused"
    else:
        level, verb = logging.ERROR, "failed"
    return level, f"call {verb}: {_pairs(pairs)} recorded=false"


class FailureLog:
    """Logs each failed or refused call on ``boundedcode_gateway.calls``, from a thread."""

    def __init__(self, max_queued: int = MAX_QUEUED_LINES) -> None:
        self._logger = logging.getLogger(LOGGER_NAME)
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=max_queued)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.dropped = 0

    def observe(self, record: CallRecord) -> None:
        """A view of the record bus: cheap, never raises, never waits."""
        line = failure_line(record)
        if line is not None:
            self._put(line)

    def refused(self, front: str, exc: GatewayError) -> None:
        """A call of ``front`` refused before it was recorded."""
        self._put(refusal_line(front, exc))

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every line queued so far is written; False on timeout."""
        with self._lock:
            if self._thread is None or self._closed:
                return True
        reached = threading.Event()
        try:
            self._queue.put(reached, timeout=timeout)
        except queue.Full:
            return False
        return reached.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        thread.join(timeout)
        if self.dropped:
            self._logger.warning(
                "%d lines of failed calls were dropped: stderr was slow", self.dropped
            )

    def _put(self, item: tuple[int, str]) -> None:
        with self._lock:
            if self._closed:
                return
            if self._thread is None:
                # started by the first failure: a gateway without one runs no thread
                self._thread = threading.Thread(target=self._run, name="failure-log", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            level, line = item
            # a broken handler must not end the thread (logging reports its own errors)
            with contextlib.suppress(Exception):
                self._logger.log(level, line)
