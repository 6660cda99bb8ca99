"""The discard event's declaration: the header, the stream option, and keeping the
option from the upstream."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from boundedcode_gateway import discard
from boundedcode_gateway.errors import InvalidRequest


@pytest.mark.parametrize(
    ("value", "declared"),
    [(None, False), ("1", True), ("true", True), (" TRUE ", True), ("0", False), ("false", False)],
)
def test_the_header(value: str | None, declared: bool) -> None:
    assert discard.header_declares(value) is declared


def test_a_header_that_says_neither_is_refused() -> None:
    with pytest.raises(InvalidRequest) as info:
        discard.header_declares("yes")
    assert info.value.param == "X-BoundedCode-Stream-Discard"


@pytest.mark.parametrize(
    ("body", "declared", "sent"),
    [
        # golden cases: the caller's body → whether it declared → what goes upstream
        ({"stream": True}, False, {"stream": True}),
        (
            {"stream": True, "stream_options": {"boundedcode_discard": True}},
            True,
            {"stream": True},
        ),
        (
            {"stream_options": {"include_usage": True, "boundedcode_discard": False}},
            False,
            {"stream_options": {"include_usage": True}},
        ),
        (
            {"stream_options": {"include_usage": True}},
            False,
            {"stream_options": {"include_usage": True}},
        ),
    ],
)
def test_the_stream_option(body: dict[str, Any], declared: bool, sent: dict[str, Any]) -> None:
    before = orjson.dumps(body)
    assert discard.body_declares(body) is declared
    assert discard.without_stream_option(body) == sent
    assert orjson.dumps(body) == before  # the caller's body is left as it was


def test_the_option_must_be_a_boolean() -> None:
    discard.check_stream_option({"boundedcode_discard": True})
    with pytest.raises(InvalidRequest):
        discard.check_stream_option({"boundedcode_discard": 1})


def test_the_event_shape() -> None:
    chunk = orjson.loads(discard.discard_chunk("call_1", "local", "the stream broke"))
    assert chunk["choices"] == [] and chunk["object"] == "chat.completion.chunk"
    assert chunk["boundedcode"] == {"event": "discard", "reason": "the stream broke"}
    assert (chunk["id"], chunk["model"]) == ("call_1", "local")
    assert isinstance(chunk["created"], int)
