"""The line on stderr per failed or refused call: what it says, what it never says, and
that it is written off the caller's thread."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.errors import CallerLeft, GatewayError, InvalidRequest, StreamBroken
from boundedcode_gateway.metering.meter import Meter
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.metering.request_facts import RequestFacts
from boundedcode_gateway.operations.failure_log import (
    LOGGER_NAME,
    FailureLog,
    failure_line,
    refusal_line,
)


class _Writer:
    """A record sink that keeps what it is handed."""

    def __init__(self) -> None:
        self.records: list[CallRecord] = []

    def publish(self, record: CallRecord) -> None:
        self.records.append(record)


def metered(end: Any, front: str = "messages", model: str = "local", **fields: Any) -> CallRecord:
    """The record a meter submits for a call of ``front`` ended by ``end(meter)``."""
    writer = _Writer()
    ctx = CallContext.new("task-7", "agent_turn", front=front)
    meter = Meter(writer, ctx, model, messages=3)
    for name, value in fields.items():
        setattr(meter.record, name, value)
    end(meter)
    return writer.records[0]


def test_a_refusal_is_one_warning_with_front_model_status_code_and_message() -> None:
    exc = InvalidRequest(
        "messages.1.role: Input should be 'user' or 'assistant'", code="invalid_role"
    )
    record = metered(lambda m: m.error(exc), stream=True, caller="ci")
    level, line = failure_line(record) or (0, "")
    assert level == logging.WARNING
    assert line == (
        "call refused: front=messages model=local status=400 code=invalid_role stream=true "
        f"task=task-7 purpose=agent_turn caller=ci call_id={record.call_id} "
        "message=\"messages.1.role: Input should be 'user' or 'assistant'\""
    )


def test_a_broken_stream_is_an_error_line_with_the_gateways_code() -> None:
    record = metered(
        lambda m: m.error(StreamBroken("the upstream stream broke")),
        front="chat",
        stream=True,
        provider="local",
        ttft_ms=41.5,  # its caller had a 200 and the first tokens
    )
    level, line = failure_line(record) or (0, "")
    assert level == logging.ERROR
    assert line.startswith(
        "call failed: front=chat model=local status=502 code=upstream_stream_broken "
        "stream=true after_content=true provider=local task=task-7"
    )
    assert line.endswith('message="the upstream stream broke"')


@pytest.mark.parametrize(
    "end",
    [
        lambda m: m.ok(),
        lambda m: m.cancelled(),  # the caller left: not the gateway's failure
        lambda m: m.abandoned(),  # the gateway's own work gave way: not a failure
    ],
    ids=["ok", "client_disconnected", "abandoned"],
)
def test_no_line_for_what_is_not_a_failure(end: Any) -> None:
    assert failure_line(metered(end)) is None


def test_an_abandoned_repair_is_neither_ok_nor_an_error() -> None:
    record = metered(lambda m: m.abandoned(), purpose="cache_repair")
    assert (record.status, record.http_status, record.error_code) == ("abandoned", 499, "abandoned")
    assert record.error_message is None


def test_what_a_caller_chose_is_clipped_and_printable() -> None:
    hostile = "\x1b[2J\u202ehidden " + "x" * 1000
    record = metered(lambda m: m.error(InvalidRequest(hostile)), model="m\x1b]0;title\x07")
    _, line = failure_line(record) or (0, "")
    assert "\x1b" not in line and "\u202e" not in line and "\x07" not in line
    assert "model=m\\x1b]0;title\\x07" in line
    assert "\\x1b[2J\\u202ehidden" in line
    assert len(line) < 900  # the message kept to 300 characters, the model's name to 128


@given(st.text(max_size=80))
def test_a_message_never_breaks_the_line_into_pairs(text: str) -> None:
    _, line = refusal_line("chat", GatewayError(text, status=400))
    assert "\n" not in line and "\r" not in line
    quoted = line.split(" message=", 1)[1].removesuffix(" recorded=false")
    if quoted.startswith('"'):
        body = quoted[1:-1]
        # every quote inside is escaped: the value ends at the last quote only
        assert all(body[i - 1] == "\\" for i, c in enumerate(body) if c == '"')


def test_no_key_header_or_message_content_reaches_the_line() -> None:
    """The record has no place for them; the line shows only the fields it names."""
    record = metered(
        lambda m: m.error(InvalidRequest("tools.0.name: too long", code="invalid_value")),
        caller="ci",
    )
    _, line = failure_line(record) or (0, "")
    for key in ("prompt_tokens", "adjustments", "attempt_log", "miss_at", "upstream_model"):
        assert key not in line


def test_a_request_refused_before_its_record_is_told_as_unrecorded() -> None:
    exc = GatewayError("Invalid API key", status=401, error_type="authentication_error")
    level, line = refusal_line("responses", exc)
    assert level == logging.WARNING
    assert line == (
        "call refused: front=responses status=401 code=authentication_error "
        'message="Invalid API key" recorded=false'
    )


def test_a_caller_that_left_before_its_body_was_whole_is_told_not_as_a_failure() -> None:
    exc = CallerLeft("The caller closed its connection after 32 of 10000 bytes of its request body")
    level, line = refusal_line("messages", exc)
    assert level == logging.INFO
    assert line == (
        'call left: front=messages status=499 code=client_disconnected message="The caller '
        'closed its connection after 32 of 10000 bytes of its request body" recorded=false'
    )


def test_lines_are_written_by_a_thread_of_their_own(caplog: pytest.LogCaptureFixture) -> None:
    log = FailureLog()
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        log.observe(metered(lambda m: m.ok()))
        log.observe(metered(lambda m: m.error(InvalidRequest("bad", code="invalid_value"))))
        assert log.flush()
    log.close()
    lines = [r for r in caplog.records if r.name == LOGGER_NAME]
    assert [r.getMessage().split(":")[0] for r in lines] == ["call refused"]
    assert lines[0].threadName == "failure-log"
    assert lines[0].thread != threading.get_ident()


def test_a_stuck_stderr_drops_lines_instead_of_holding_the_caller() -> None:
    release = threading.Event()

    class Stuck(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            release.wait(10)

    logger = logging.getLogger(LOGGER_NAME)
    handler = Stuck()
    logger.addHandler(handler)
    try:
        log = FailureLog(max_queued=2)
        for _ in range(10):
            log.refused("chat", InvalidRequest("bad"))  # returns at once, every time
        assert log.dropped >= 7
    finally:
        release.set()
        log.close()
        logger.removeHandler(handler)


def test_request_facts_are_read_from_the_request_as_sent() -> None:
    assert RequestFacts.of(
        {"model": "local", "stream": True, "messages": [{}, {}, {}], "system": "s"}
    ) == RequestFacts("local", True, 3)
    assert RequestFacts.of({"model": "m", "input": [{}, {}]}) == RequestFacts("m", False, 2)
    assert RequestFacts.of({"model": "m", "input": "hello"}) == RequestFacts("m", False, 1)
    # a wrong type is as good as absent: a refusal is still recorded with what can be read
    assert RequestFacts.of({"model": 7, "stream": "yes", "messages": {}}) == RequestFacts(None)
    assert RequestFacts.of([1, 2]) == RequestFacts(None)
