"""Server-sent events: an incremental decoder and the encoder the gateway answers with.

Pure and synchronous: bytes in, events out. Knows nothing of any provider's
payloads; it must not parse JSON.
"""

from __future__ import annotations

from typing import NamedTuple

DONE = b"[DONE]"


class SSEEvent(NamedTuple):
    """One dispatched event: its ``event:`` name ("" when absent) and joined ``data:`` lines."""

    event: str
    data: bytes


class SSEDecoder:
    """Turns any split of an SSE byte stream into the same events (WHATWG rules)."""

    __slots__ = ("_buf", "_data", "_event", "_has_data")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._event = ""
        self._has_data = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume bytes; return the events completed by them."""
        buf = self._buf + chunk if self._buf else chunk
        lines = buf.splitlines(keepends=True)
        # a last line without its terminator is incomplete; a lone trailing \r may
        # still be the first half of \r\n
        if lines and (not lines[-1].endswith((b"\n", b"\r")) or lines[-1].endswith(b"\r")):
            self._buf = lines.pop()
        else:
            self._buf = b""
        events: list[SSEEvent] = []
        for raw in lines:
            line = raw.rstrip(b"\r\n")
            if not line:
                if self._has_data:
                    events.append(SSEEvent(self._event, b"\n".join(self._data)))
                self._data = []
                self._event = ""
                self._has_data = False
            else:
                self._field(line)
        return events

    def _field(self, line: bytes) -> None:
        if line[0] == 58:  # ":" starts a comment (llama-server's keep-alive pings)
            return
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._has_data = True
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")

    def close(self) -> list[SSEEvent]:
        """End of stream: a trailing CR ends its line; an event not yet dispatched is dropped."""
        if self._buf.endswith(b"\r"):
            return self.feed(b"\n")
        return []


def encode_data(payload: bytes) -> bytes:
    """Frame one JSON payload as a ``data:`` event."""
    return b"data: " + payload + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"
