"""Server-sent events: an incremental decoder and the encoder the gateway answers with.

Pure and synchronous: bytes in, events out. Knows nothing of any provider's
payloads; it must not parse JSON.
"""

from __future__ import annotations

from typing import NamedTuple

DONE = b"[DONE]"
# an event's lines together (every line up to the blank one that ends it, whatever its
# field), or a line not yet ended, may hold this much
DEFAULT_MAX_EVENT_BYTES = 8 << 20


class SSEEvent(NamedTuple):
    """One dispatched event: its ``event:`` name ("" when absent) and joined ``data:`` lines."""

    event: str
    data: bytes


class EventTooLarge(ValueError):
    """An event's lines, or a line that has not ended, passed the decoder's limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"an event of the stream is larger than {limit} bytes")
        self.limit = limit


class SSEDecoder:
    """Turns any split of an SSE byte stream into the same events (WHATWG rules), each
    event within ``max_event_bytes`` (else ``EventTooLarge``).

    The limit counts every byte of an event's lines, their ends included, whatever the
    field: an empty ``data`` line adds a list entry though it adds no data, and comments
    and unknown fields would otherwise let a stream that never ends an event run on."""

    __slots__ = ("_data", "_event", "_event_size", "_has_data", "_limit", "_tail", "_tail_size")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._limit = max_event_bytes
        # the pieces of the line not yet ended, joined only once it ends (a long line
        # arriving in many reads is not copied again with each one)
        self._tail: list[bytes] = []
        self._tail_size = 0
        self._data: list[bytes] = []
        self._event_size = 0
        self._event = ""
        self._has_data = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume bytes; return the events completed by them."""
        tail = self._tail
        if tail:
            # a tail ending in CR has ended its line, whatever follows
            ended = tail[-1].endswith(b"\r")
            tail.append(chunk)
            if not ended and b"\n" not in chunk and b"\r" not in chunk:
                self._tail_size += len(chunk)
                self._check()
                return []
            buf = b"".join(tail)
            tail.clear()
            self._tail_size = 0
        else:
            buf = chunk
        if not _may_end_or_keep(buf):
            return self._count_only(buf)
        lines = buf.splitlines(keepends=True)
        # a last line without its terminator is incomplete; a lone trailing \r may
        # still be the first half of \r\n
        if lines and (not lines[-1].endswith((b"\n", b"\r")) or lines[-1].endswith(b"\r")):
            last = lines.pop()
            tail.append(last)
            # a lone CR is a blank line in waiting: it adds nothing to the event
            self._tail_size = 0 if last == b"\r" else len(last)
        events: list[SSEEvent] = []
        limit = self._limit
        size = self._event_size
        for raw in lines:
            line = raw.rstrip(b"\r\n")
            if not line:
                if self._has_data:
                    events.append(SSEEvent(self._event, b"\n".join(self._data)))
                self._data = []
                size = 0
                self._event = ""
                self._has_data = False
            else:
                # counted before the line is kept: the event never holds more than the limit
                size += len(raw)
                if size > limit:
                    raise EventTooLarge(limit)
                self._field(line)
        self._event_size = size
        self._check()
        return events

    def _count_only(self, buf: bytes) -> list[SSEEvent]:
        """Bytes whose lines neither end the event nor carry a field it keeps: they only
        count toward the limit, so a flood of comments or unknown fields costs a few
        scans of each read rather than a step per line."""
        # a trailing CR may be the first half of CRLF: its line stays unended
        body = buf[:-1] if buf.endswith(b"\r") else buf
        ended = max(body.rfind(b"\n"), body.rfind(b"\r")) + 1
        self._event_size += ended
        if ended < len(buf):
            self._tail.append(buf[ended:])
            self._tail_size = len(buf) - ended
        self._check()
        return []

    @property
    def pending(self) -> bool:
        """Whether bytes after the last event's end are held: a line not yet ended, or the
        lines of an event not yet ended."""
        return bool(self._tail) or self._event_size > 0

    def _check(self) -> None:
        if self._event_size + self._tail_size > self._limit:
            raise EventTooLarge(self._limit)

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
        if not self._tail:
            return []
        buf = b"".join(self._tail)
        self._tail.clear()
        self._tail_size = 0
        # the same line end as one byte that cannot wait for an LF
        return self.feed(buf[:-1] + b"\n" if buf.endswith(b"\r") else buf)


def _may_end_or_keep(buf: bytes) -> bool:
    """Whether ``buf`` (starting at a line's start) may hold a blank line, which ends an
    event, or a ``data`` or ``event`` field; False only when it surely holds neither."""
    return (
        buf[:1] in (b"\n", b"\r")
        or b"\n\n" in buf
        or b"\n\r" in buf
        or b"\r\r" in buf
        or b"data" in buf
        or b"event" in buf
    )


def encode_data(payload: bytes) -> bytes:
    """Frame one JSON payload as a ``data:`` event."""
    return b"data: " + payload + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"
