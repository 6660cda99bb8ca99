"""An upstream's error, once its adapter has read the fields, as the gateway's error (pure).

Every adapter reads its provider's error body its own way and ends here, so
context overflow, OpenAI's error types and secret redaction are decided once.
"""

from __future__ import annotations

from boundedcode_gateway.errors import ContextLengthExceeded, GatewayError, UpstreamFailure, redact
from boundedcode_gateway.policy.context_overflow import is_context_overflow

# OpenAI's error type for an upstream status, when the upstream names none we keep
TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


# the most of an upstream's error message that reaches a caller: its own words in full,
# a text that is not its error object (a proxy's HTML page, an object of its own) shorter
MESSAGE_CHARS = 4000
TEXT_CHARS = 500
# an error's type, code or param longer than this is not one
FIELD_CHARS = 200


def upstream_error(
    status: int,
    message: str,
    *,
    error_type: str | None,
    code: str | None,
    param: str | None = None,
    secrets: tuple[str, ...] = (),
    max_chars: int = MESSAGE_CHARS,
) -> GatewayError:
    """The gateway error for an upstream's error answer, in OpenAI's shape.

    Every string here came from the upstream: the key is taken out of each, and only
    then is any cut to length (a cut first could leave part of the key behind).
    """
    message = redact(message, secrets)[:max_chars]
    error_type = _field(error_type, secrets)
    code = _field(code, secrets)
    param = _field(param, secrets)
    if is_context_overflow(message, error_type, code, status):
        return ContextLengthExceeded(message, param="messages")
    return UpstreamFailure(
        message,
        status=status,
        error_type=error_type or TYPE_BY_STATUS.get(status, "upstream_error"),
        code=code,
        param=param,
    )


def _field(value: str | None, secrets: tuple[str, ...]) -> str | None:
    return redact(value, secrets)[:FIELD_CHARS] if value is not None else None


def error_from_text(status: int, raw: bytes, secrets: tuple[str, ...] = ()) -> GatewayError:
    """The gateway error for an error answer whose body is not JSON (a proxy's HTML page)."""
    text = raw.decode("utf-8", "replace").strip()
    return upstream_error(
        status,
        text or "the upstream answered with an empty error body",
        error_type=None,
        code=None,
        secrets=secrets,
        max_chars=TEXT_CHARS,
    )
