"""Golden cases: the gateway's errors in Anthropic's shape and statuses
(fronts/messages/errors.py), each body read with the official SDK's ``ErrorResponse``."""

from __future__ import annotations

import re

import orjson
import pytest
from anthropic.types.shared.error_response import ErrorResponse

from boundedcode_gateway.errors import (
    BodyTooLarge,
    BudgetExceeded,
    ContextLengthExceeded,
    Forbidden,
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    StreamBroken,
    Unauthenticated,
    UpstreamFailure,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from boundedcode_gateway.fronts.messages.errors import (
    anthropic_message,
    from_gateway_error,
    from_stream_error,
    prompt_too_long,
)


@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (InvalidRequest("bad"), 400, "invalid_request_error"),
        (Unauthenticated("who?"), 401, "authentication_error"),
        (Forbidden("no"), 403, "permission_error"),
        (ModelNotFound("none"), 404, "not_found_error"),
        (MethodNotAllowed("POST"), 405, "invalid_request_error"),
        (BodyTooLarge("big"), 413, "request_too_large"),
        (BudgetExceeded("spent"), 429, "rate_limit_error"),
        (UpstreamFailure("slow down", status=429), 429, "rate_limit_error"),
        (InternalError("bug"), 500, "api_error"),
        (StreamBroken("broke"), 502, "api_error"),
        (UpstreamUnavailable("busy"), 529, "overloaded_error"),
        (UpstreamFailure("Overloaded", status=529), 529, "overloaded_error"),
        (UpstreamTimeout("late"), 504, "timeout_error"),
        (UpstreamFailure("teapot", status=418), 418, "invalid_request_error"),
    ],
)
def test_statuses_and_types(exc: GatewayError, status: int, kind: str) -> None:
    got_status, body = from_gateway_error(exc)
    assert got_status == status
    parsed = orjson.loads(body)
    request_id = parsed.pop("request_id")
    assert parsed == {"type": "error", "error": {"type": kind, "message": anthropic_message(exc)}}
    # Anthropic's request id, in the body and as the response's request-id header
    assert re.fullmatch(r"req_[0-9A-Za-z]{24}", request_id)
    assert exc.headers["request-id"] == request_id
    if kind != "request_too_large":  # Anthropic's errors page lists it; the SDK's type not yet
        ErrorResponse.model_validate(orjson.loads(body))


@pytest.mark.parametrize(
    ("message", "worded"),
    [
        (
            "request (5000 tokens) exceeds the available context size (4096 tokens), try "
            "increasing it",
            "prompt is too long: 5000 tokens > 4096 maximum",
        ),
        (
            "prompt is too long: 208656 tokens > 200000 maximum",
            "prompt is too long: 208656 tokens > 200000 maximum",
        ),
        (
            "The input token count (1200000) exceeds the maximum number of tokens allowed "
            "(1048576).",
            "prompt is too long: 1200000 tokens > 1048576 maximum",
        ),
        (
            "This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9000 tokens.",
            "prompt is too long: 9000 tokens > 8192 maximum",
        ),
        (
            "Input is too long for requested model.",
            "prompt is too long: Input is too long for requested model.",
        ),
    ],
)
def test_an_overflow_is_worded_as_anthropic_words_it(message: str, worded: str) -> None:
    assert prompt_too_long(message) == worded
    status, body = from_gateway_error(ContextLengthExceeded(message))
    assert status == 400
    assert orjson.loads(body)["error"] == {"type": "invalid_request_error", "message": worded}


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (
            {"message": "m", "type": "upstream_error", "code": "upstream_unavailable"},
            "overloaded_error",
        ),
        ({"message": "m", "type": "upstream_error", "code": "upstream_timeout"}, "timeout_error"),
        ({"message": "m", "type": "upstream_error", "code": "upstream_stream_broken"}, "api_error"),
        ({"message": "m", "type": "overloaded_error", "code": None}, "overloaded_error"),
        (
            {"message": "m", "type": "rate_limit_error", "code": "rate_limit_exceeded"},
            "rate_limit_error",
        ),
        ({"message": "m", "type": "server_error", "code": "internal_error"}, "api_error"),
        ({"message": "m", "type": "invalid_request_error", "code": None}, "invalid_request_error"),
        ("not an object", "api_error"),
    ],
)
def test_an_error_in_a_stream_has_no_status_but_its_kind(error: object, kind: str) -> None:
    parsed = ErrorResponse.model_validate(orjson.loads(from_stream_error(error)))
    assert parsed.error.type == kind


@pytest.mark.parametrize(
    ("exc", "worded"),
    [
        # what Anthropic answers for each case
        (
            ModelNotFound("The model 'claude-x' does not exist on this gateway"),
            "model: claude-x",
        ),
        (Unauthenticated("No API key given: send it as ..."), "x-api-key header is required"),
        (Unauthenticated("Invalid API key"), "invalid x-api-key"),
        (
            BodyTooLarge("Request body exceeds"),
            "Request exceeds the maximum allowed number of bytes.",
        ),
        (InvalidRequest("max_tokens: Field required"), "max_tokens: Field required"),
    ],
)
def test_the_cases_anthropic_has_words_for_are_in_its_words(exc: GatewayError, worded: str) -> None:
    assert anthropic_message(exc) == worded
    assert orjson.loads(from_gateway_error(exc)[1])["error"]["message"] == worded
