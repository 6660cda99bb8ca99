"""The SSE decoder: framing rules, and any split of the bytes gives the same events."""

from __future__ import annotations

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
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
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
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert decode_all(chunks) == decode_all([stream])
    assert decode_all([stream])[0] == SSEEvent("delta", b'{"a":\n1}')
