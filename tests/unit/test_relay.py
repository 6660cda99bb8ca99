"""``relay.py``: one streamed answer from its upstream response to its record, against a
scripted server and the OpenAI adapter's translator."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson
import pytest

from boundedcode_gateway.attempts import AttemptLog, Attempts
from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.errors import GatewayError, StreamBroken, UpstreamTimeout
from boundedcode_gateway.metering.meter import CLIENT_CLOSED, Meter
from boundedcode_gateway.providers.base import PreparedRequest, RequestOptions
from boundedcode_gateway.relay import StreamRelay
from boundedcode_gateway.upstream.http import HttpClient, Timeouts
from boundedcode_gateway.upstream.metrics import CallMetrics
from tests.outcomes import outcomes
from tests.unit.scripted_http import (
    DONE,
    FINISH,
    ROLE,
    Answer,
    RecordingWriter,
    ScriptedServer,
    chunk,
    chunked,
    head,
    openai_upstream,
    sse,
    text_chunks,
)

ANSWER = ["Hel", "lo", " there"]
WHOLE = [ROLE, *text_chunks(*ANSWER), FINISH, DONE]


@dataclass
class Harness:
    """A relay's surroundings: the server it reads, how its call ended (as the call's meter
    records it), what its sends came to, what succeeded."""

    server: ScriptedServer
    http: HttpClient
    writer: RecordingWriter = field(default_factory=RecordingWriter)
    successes: list[CallMetrics] = field(default_factory=list)
    # each relay's attempt log, in the order the relays were made
    logs: list[AttemptLog] = field(default_factory=list)
    # each end the relays reported: (error, caller gone)
    ends: list[tuple[GatewayError | None, bool]] = field(default_factory=list)

    @property
    def log(self) -> AttemptLog:
        """The latest relay's attempt log."""
        return self.logs[-1]

    def relay(self, monkeypatch: pytest.MonkeyPatch, aware: bool = False) -> StreamRelay:
        upstream = openai_upstream(self.server.url, self.http, monkeypatch)
        options = RequestOptions(stream=True, include_usage=False, return_progress=False)
        if aware:
            options = RequestOptions(
                stream=True, include_usage=False, return_progress=False, understands_discard=True
            )
        ctx = CallContext.new("t", "agent_turn")
        meter = Meter(self.writer, ctx, "gpt")
        log = AttemptLog()
        self.logs.append(log)
        prepared = PreparedRequest("/v1/chat/completions", {}, b"{}")
        attempts = Attempts(self.http, upstream, prepared, log, _no_wait, root=self.server.url)

        def on_end(error: GatewayError | None, cancelled: bool) -> None:
            # the call's outcome goes to its meter as the call flow's end sends it
            self.ends.append((error, cancelled))
            if cancelled:
                meter.cancelled()
            elif error is None:
                meter.ok()
            else:
                meter.error(error)

        return StreamRelay(
            ctx,
            "gpt",
            attempts,
            lambda: upstream.stream_translator(options),
            options,
            self.successes.append,
            on_end,
        )


async def _no_wait(seconds: float) -> None:
    return None


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    server = ScriptedServer()
    await server.start()
    http = HttpClient(Timeouts(connect_s=5.0, read_s=5.0))
    yield Harness(server, http)
    await http.close()
    await server.stop()


def _stream(*events: bytes, then: str = "end") -> Answer:
    """A streamed answer; ``then="break"`` drops the connection after the events."""
    if then == "end":
        return chunked(200, events, {"Content-Type": "text/event-stream"})
    start = head(200, {"Content-Type": "text/event-stream"})
    return Answer([start, b"".join(events)], "close")


def _in_one_write(*events: bytes) -> Answer:
    """Every event in one TCP write, so event order alone can decide."""
    return chunked(200, [b"".join(events)], {"Content-Type": "text/event-stream"})


def _payloads(raw: bytes) -> list[object]:
    out: list[object] = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: "):
            data = block[6:]
            out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out


def _text(raw: bytes | list[object]) -> str:
    """The content the chunks carry (of a raw stream, or of its payloads)."""
    payloads = _payloads(raw) if isinstance(raw, bytes) else raw
    return "".join(
        p["choices"][0]["delta"].get("content") or ""
        for p in payloads
        if isinstance(p, dict) and p.get("choices")
    )


async def _rest(relay: StreamRelay) -> bytes:
    return b"".join([piece async for piece in relay.chunks()])


async def test_the_first_bytes_end_with_the_first_content_whatever_the_tcp_split(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.server.queue(_in_one_write(*WHOLE))
    relay = harness.relay(monkeypatch)
    first = await relay.open()
    assert _text(first) == "Hel"
    rest = await _rest(relay)
    assert _text(rest) == "lo there" and rest.endswith(b"data: [DONE]\n\n")
    [record] = harness.writer.records
    assert record.status == "ok" and harness.log.count == 1
    assert outcomes(harness.log.entries) == [{"status": 200, "code": None}]
    assert len(harness.successes) == 1 and harness.successes[0].finish_reason == "stop"


async def test_an_error_right_after_the_first_content_is_in_the_stream(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = sse({"error": {"message": "mid-answer failure", "type": "server_error", "code": 500}})
    harness.server.queue(_in_one_write(ROLE, *text_chunks("Hel"), error))
    relay = harness.relay(monkeypatch)
    first = await relay.open()  # not raised: content came first
    assert _text(first) == "Hel"
    rest = _payloads(await _rest(relay))
    assert rest == [
        {
            "error": {
                "message": "mid-answer failure",
                "type": "server_error",
                "param": None,
                "code": None,
            }
        }
    ]
    [record] = harness.writer.records
    assert (record.status, record.http_status) == ("error", 500)
    assert harness.successes == []


async def test_an_error_before_content_is_raised_with_its_status(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = sse(
        {"error": {"message": "bad sampling", "type": "invalid_request_error", "code": 400}}
    )
    harness.server.queue(_in_one_write(ROLE, error, *text_chunks("never")))
    relay = harness.relay(monkeypatch)
    with pytest.raises(GatewayError) as info:
        await relay.open()
    assert info.value.http_status == 400 and info.value.message == "bad sampling"
    relay.release()
    # the pipeline records a raised error itself; the relay ended nothing
    assert harness.ends == [] and harness.writer.records == []
    assert len(harness.server.seen) == 1


async def test_a_break_before_content_is_sent_again_and_its_role_chunk_dropped(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.server.queue(_stream(ROLE, then="break"), _stream(*WHOLE))
    relay = harness.relay(monkeypatch)
    raw = await relay.open() + await _rest(relay)
    roles = [
        p
        for p in _payloads(raw)
        if isinstance(p, dict) and p.get("choices") and "role" in p["choices"][0]["delta"]
    ]
    assert len(roles) == 1 and _text(raw) == "Hello there"
    [record] = harness.writer.records
    assert record.status == "ok"
    assert harness.log.retried is True and harness.log.count == 2
    assert outcomes(harness.log.entries) == [
        {"status": 502, "code": "upstream_stream_broken"},
        {"status": 200, "code": None},
    ]


async def test_two_breaks_before_content_raise_the_break(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.server.queue(_stream(ROLE, then="break"), _stream(ROLE, then="break"))
    relay = harness.relay(monkeypatch)
    with pytest.raises(StreamBroken):
        await relay.open()
    relay.release()
    assert len(harness.server.seen) == 2


@pytest.mark.parametrize("aware", [False, True], ids=["undeclared", "declaring"])
async def test_a_break_after_content_is_answered_as_the_caller_declared(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, aware: bool
) -> None:
    harness.server.queue(_stream(ROLE, *text_chunks("Hel"), then="break"), _stream(*WHOLE))
    relay = harness.relay(monkeypatch, aware=aware)
    payloads = _payloads(await relay.open() + await _rest(relay))
    discards = [p for p in payloads if isinstance(p, dict) and "boundedcode" in p]
    [record] = harness.writer.records
    if aware:
        assert len(discards) == 1 and payloads[-1] == "[DONE]"
        at = payloads.index(discards[0])
        assert _text(payloads[:at]) == "Hel" and _text(payloads[at + 1 :]) == "Hello there"
        assert record.status == "ok" and harness.log.count == 2
    else:
        assert discards == [] and "[DONE]" not in payloads
        last = payloads[-1]
        assert isinstance(last, dict) and last["error"]["code"] == "upstream_stream_broken"
        assert record.status == "error" and harness.log.count == 1
        assert len(harness.server.seen) == 1


async def test_a_caller_that_leaves_is_recorded_once_and_the_upstream_let_go(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = head(200, {"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked"})
    harness.server.queue(Answer([start, chunk(ROLE + text_chunks("Hel")[0])], "hold"))
    relay = harness.relay(monkeypatch)
    assert _text(await relay.open()) == "Hel"
    relay.close(cancelled=True)
    relay.close()
    assert harness.ends == [(None, True)]  # the relay ends its call once
    [record] = harness.writer.records
    assert (record.status, record.http_status, record.error_code) == (
        "error",
        CLIENT_CLOSED,
        "client_disconnected",
    )
    # the connection was closed, which is what stops an upstream's generation
    await asyncio.wait_for(harness.server.client_left.wait(), 5)


async def test_a_whole_answer_gives_its_connection_back(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.server.queue(_stream(*WHOLE), _stream(*WHOLE))
    for _ in range(2):
        relay = harness.relay(monkeypatch)
        await relay.open()
        await _rest(relay)
    assert [s.connection for s in harness.server.seen] == [1, 1]


async def test_a_limit_of_the_call_ends_an_open_answer_in_the_in_stream_error(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.server.queue(Answer([head(200, {"Content-Type": "text/event-stream"}), *WHOLE[:2]]))
    relay = harness.relay(monkeypatch)
    assert _text(await relay.open()) == "Hel"
    out = relay.fail(UpstreamTimeout("the call ran longer than inference.max_call_s (1 s)"))
    assert _payloads(out) == [
        {
            "error": {
                "message": "the call ran longer than inference.max_call_s (1 s)",
                "type": "server_error",
                "param": None,
                "code": "upstream_timeout",
            }
        }
    ]
    assert outcomes(harness.log.entries)[-1] == {"status": 504, "code": "upstream_timeout"}
    assert [type(e).__name__ for e, _ in harness.ends] == ["UpstreamTimeout"]


async def test_a_limit_met_after_the_answer_was_whole_sends_its_end_again(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.server.queue(_stream(*WHOLE))
    relay = harness.relay(monkeypatch)
    await relay.open()
    assert (await _rest(relay)).endswith(DONE)
    assert relay.fail(UpstreamTimeout("late")) == DONE
    assert harness.ends == [(None, False)]  # recorded as answered, once
