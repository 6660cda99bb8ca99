"""The SSE decoder: framing rules, and any split of the bytes gives the same events."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.wire.sse import EventTooLarge, SSEDecoder, SSEEvent, encode_data


def decode_all(chunks: list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    events += decoder.close()
    return events


def _split(data: st.DataObject, stream: bytes, max_cuts: int) -> list[bytes]:
    """``stream`` cut at up to ``max_cuts`` places Hypothesis draws."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=max_cuts)))
    return [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]


LLAMA_STREAM = (
    b'data: {"choices":[{"delta":{"role":"assistant","content":null}}]}\n\n'
    b":\n\n"  # keep-alive ping
    b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n'
    b"data: [DONE]\n\n"
)

ANTHROPIC_STREAM = (
    b"event: message_start\r\n"
    b'data: {"type":"message_start"}\r\n'
    b"\r\n"
    b"event: ping\r\n"
    b'data: {"type": "ping"}\r\n'
    b"\r\n"
)


def test_data_events_and_done() -> None:
    events = decode_all([LLAMA_STREAM])
    assert [e.data for e in events] == [
        b'{"choices":[{"delta":{"role":"assistant","content":null}}]}',
        b'{"choices":[{"delta":{"content":"Hi"}}]}',
        b"[DONE]",
    ]
    assert all(e.event == "" for e in events)


def test_named_events_with_crlf() -> None:
    events = decode_all([ANTHROPIC_STREAM])
    assert events == [
        SSEEvent("message_start", b'{"type":"message_start"}'),
        SSEEvent("ping", b'{"type": "ping"}'),
    ]


def test_multiline_data_is_joined_with_newlines() -> None:
    assert decode_all([b"data: a\ndata: b\n\n"]) == [SSEEvent("", b"a\nb")]


def test_event_without_blank_line_at_eof_is_dropped() -> None:
    assert decode_all([b'data: {"partial": true}\n']) == []


def test_lone_cr_split_from_lf_is_one_line_end() -> None:
    assert decode_all([b"data: x\r", b"\n\r\n"]) == [SSEEvent("", b"x")]


def test_encode_data_round_trips() -> None:
    assert decode_all([encode_data(b'{"a":1}')]) == [SSEEvent("", b'{"a":1}')]


@given(st.data())
def test_any_split_gives_the_same_events(data: st.DataObject) -> None:
    stream = data.draw(st.sampled_from([LLAMA_STREAM, ANTHROPIC_STREAM]))
    chunks = _split(data, stream, 12)
    assert decode_all(chunks) == decode_all([stream])


CR_ONLY_MULTI_LINE = (
    b'event: delta\rdata: {"a":\rdata: 1}\r\r: ping\r\rdata: ' + b"x" * 300 + b"\r\r"
)


def test_an_event_past_the_limit_is_refused() -> None:
    decoder = SSEDecoder(max_event_bytes=100)
    assert decoder.feed(b"data: " + b"a" * 90 + b"\n\n") == [SSEEvent("", b"a" * 90)]
    # data lines of one event add up
    with pytest.raises(EventTooLarge):
        decoder.feed(b"data: " + b"b" * 60 + b"\ndata: " + b"c" * 60 + b"\n")


@pytest.mark.parametrize("pieces", [1, 3, 50])
def test_a_whole_event_past_the_limit_is_refused_however_it_arrives(pieces: int) -> None:
    stream = b"data: " + b"d" * 150 + b"\n\n"
    size = -(-len(stream) // pieces)
    decoder = SSEDecoder(max_event_bytes=100)
    with pytest.raises(EventTooLarge):
        for i in range(0, len(stream), size):
            decoder.feed(stream[i : i + size])


def test_a_line_that_never_ends_is_refused_however_it_arrives() -> None:
    decoder = SSEDecoder(max_event_bytes=1000)
    decoder.feed(b"data: {")
    for _ in range(9):
        decoder.feed(b"x" * 100)
    with pytest.raises(EventTooLarge):
        decoder.feed(b"x" * 100)


def test_a_long_line_in_many_pieces_is_one_event() -> None:
    line = b"data: " + b"y" * 5000
    pieces = [line[i : i + 7] for i in range(0, len(line), 7)]
    assert decode_all([*pieces, b"\n\n"]) == [SSEEvent("", b"y" * 5000)]


def test_a_blank_line_split_after_its_cr_still_ends_the_event_at_the_end() -> None:
    assert decode_all([b"data: z\r", b"\r", b"data: partial"]) == [SSEEvent("", b"z")]


@given(st.data())
def test_any_split_of_odd_framings_gives_the_same_events(data: st.DataObject) -> None:
    stream = CR_ONLY_MULTI_LINE + LLAMA_STREAM.replace(b"\n", b"\r\n")
    chunks = _split(data, stream, 20)
    assert decode_all(chunks) == decode_all([stream])
    assert decode_all([stream])[0] == SSEEvent("delta", b'{"a":\n1}')


# -- every line of an event counts toward the limit, whatever its field


@pytest.mark.parametrize(
    "line",
    [b"data\n", b"data:\n", b": keep-alive\n", b"id: 7\n", b"retry: 10\n", b"x-unknown: 1\n"],
    ids=["empty-data", "empty-data-colon", "comment", "id", "retry", "unknown-field"],
)
def test_lines_that_add_no_data_still_count_toward_the_limit(line: bytes) -> None:
    decoder = SSEDecoder(max_event_bytes=1000)
    # one piece, then the same lines a few at a time: neither gets past the limit
    with pytest.raises(EventTooLarge):
        decoder.feed(line * (1000 // len(line) + 1))
    decoder = SSEDecoder(max_event_bytes=1000)
    with pytest.raises(EventTooLarge):
        for _ in range(1000):
            decoder.feed(line * 3)


def test_an_event_ended_in_time_resets_the_count() -> None:
    decoder = SSEDecoder(max_event_bytes=1000)
    events: list[SSEEvent] = []
    for _ in range(100):  # 100 events of 900 bytes each: each within the limit
        events += decoder.feed(b"data\n" * 100 + b": ping\n" * 50 + b"data: x\n\n")
    assert len(events) == 100
    assert events[0] == SSEEvent("", b"\n" * 100 + b"x")


def test_the_limit_counts_whole_lines_not_only_data_values() -> None:
    # 20 data lines hold 800 bytes of values in 940 bytes of lines (47 each)
    event = b"data: " + b"v" * 40 + b"\n"
    assert SSEDecoder(max_event_bytes=940).feed(event * 20 + b"\n") != []
    with pytest.raises(EventTooLarge):
        SSEDecoder(max_event_bytes=939).feed(event * 20 + b"\n")


_LINES = st.sampled_from(
    [b"data\n", b"data: abc\n", b": c\n", b"event: e\n", b"\n", b"data\r\n", b"\r\n", b"x\r"]
)


def _outcome(chunks: list[bytes], limit: int) -> list[SSEEvent] | str:
    decoder = SSEDecoder(max_event_bytes=limit)
    events: list[SSEEvent] = []
    try:
        for chunk in chunks:
            events += decoder.feed(chunk)
        events += decoder.close()
    except EventTooLarge:
        return "too large"
    return events


@given(st.data())
def test_any_split_reaches_the_limit_alike(data: st.DataObject) -> None:
    stream = b"".join(data.draw(st.lists(_LINES, max_size=60)))
    limit = data.draw(st.integers(1, 80))
    chunks = _split(data, stream, 12)
    assert _outcome(chunks, limit) == _outcome([stream], limit)


def _reference(stream: bytes, limit: int) -> list[SSEEvent] | str:
    """The WHATWG rules read a whole line at a time, with the limit on each event's lines
    and on a last line the stream never ends: what any split of the stream must give."""
    *ended, unended = re.split(rb"(\r\n|\r|\n)", stream)
    events: list[SSEEvent] = []
    data: list[bytes] = []
    name, size = "", 0
    for text, end in zip(ended[::2], ended[1::2], strict=True):
        if not text:
            if data:
                events.append(SSEEvent(name, b"\n".join(data)))
            data, name, size = [], "", 0
            continue
        size += len(text) + len(end)
        if size > limit:
            return "too large"
        field, colon, value = text.partition(b":")
        value = value[1:] if colon and value[:1] == b" " else value
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value.decode()
    return "too large" if size + len(unended) > limit else events


_ANY_LINES = st.sampled_from(
    [
        *(b"data\n", b"data: ab\r", b"event: e\r\n", b": c\r", b"x\r", b"id: 1\n"),
        *(b"\n", b"\r", b"\r\n", b"xy"),
    ]
)


@given(st.data())
def test_any_split_decodes_as_whole_lines_do(data: st.DataObject) -> None:
    stream = b"".join(data.draw(st.lists(_ANY_LINES, max_size=60)))
    limit = data.draw(st.integers(1, 80))
    chunks = _split(data, stream, 12)
    assert _outcome(chunks, limit) == _reference(stream, limit)


@pytest.mark.parametrize("pieces", [[b"data: abc\n", b"\r", b"\n"], [b"data: abc\n", b"\r", b"ab"]])
def test_an_event_at_the_limit_ends_though_its_blank_line_comes_apart(pieces: list[bytes]) -> None:
    decoder = SSEDecoder(max_event_bytes=10)
    events = [event for piece in pieces for event in decoder.feed(piece)]
    assert events == [SSEEvent("", b"abc")]


def test_a_last_line_ended_by_cr_counts_its_own_bytes_at_the_close() -> None:
    decoder = SSEDecoder(max_event_bytes=2)
    assert decoder.feed(b"x\r") == []
    assert decoder.close() == []


def test_pending_says_whether_an_event_is_cut_short() -> None:
    decoder = SSEDecoder()
    assert not decoder.pending
    decoder.feed(b"data: {")
    assert decoder.pending
    decoder.feed(b"}\n")
    assert decoder.pending
    assert decoder.feed(b"\n") == [SSEEvent("", b"{}")]
    assert not decoder.pending
    decoder.feed(b": ping\n")
    assert decoder.pending
    decoder.feed(b"\n")
    assert not decoder.pending
