"""The gateway's one error tree.

Every error a caller can see is a ``GatewayError``; each class knows its HTTP
status, OpenAI ``type`` and ``code``, and whether the retry policy may resend.
The tree::

    GatewayError
    ├── InvalidRequest            400 invalid_request_error
    │   ├── ContextLengthExceeded 400 context_length_exceeded
    │   ├── CapabilityMissing     400 capability_missing
    │   └── RemoteMediaRefused    400 remote_media_refused
    ├── Unauthenticated           401 invalid_api_key
    ├── Forbidden                 403 model_not_allowed, task_mismatch, …
    ├── ModelNotFound             404 model_not_found
    ├── BodyTooLarge              413 request_too_large
    ├── CallerLeft                499 client_disconnected (answered to no one)
    ├── BudgetExceeded            429 budget_exceeded
    ├── MissingApiKey             500 missing_api_key
    ├── InvalidApiKeyConfig       500 invalid_api_key_config
    ├── InternalError             500 internal_error
    └── UpstreamFailure           status of the upstream (or 502)
        ├── UpstreamUnavailable   503 upstream_unavailable
        ├── UpstreamTimeout       504 upstream_timeout
        ├── MalformedResponse     502 malformed_response
        ├── ResponseTooLarge      502 upstream_response_too_large
        ├── StreamBroken          502 upstream_stream_broken
        └── ProxyRefused          502 proxy_refused

``ConfigError`` is separate: it stops start-up and never reaches a caller.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from typing import Any, ClassVar

import orjson

from boundedcode_gateway.text import clip, printable

log = logging.getLogger(__name__)


class ConfigError(Exception):
    """The configuration file cannot be used; the message names the key and its place."""


class GatewayError(Exception):
    """An error answered to the caller in OpenAI's error shape."""

    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        error_type: str | None = None,
        retryable: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.http_status = status if status is not None else self.status
        self.type = error_type if error_type is not None else self.error_type
        # a failure of the transport that resending may cure (refused, reset)
        self.retryable = retryable
        # headers the caller should see with this error (Retry-After)
        self.headers: dict[str, str] = {}

    def to_body(self) -> dict[str, Any]:
        """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_body())

    def to_stream_body(self) -> dict[str, Any]:
        """The error that ends a stream: OpenAI's body, a server fault (a 5xx) typed
        ``server_error`` as OpenAI's own streams type one (clients retry on that type:
        opencode on no other), the gateway's code kept."""
        body = self.to_body()
        if self.http_status >= 500:
            body["error"]["type"] = "server_error"
        return body


class InvalidRequest(GatewayError):
    status = 400
    error_type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    default_code = "context_length_exceeded"


class CapabilityMissing(InvalidRequest):
    default_code = "capability_missing"


class RemoteMediaRefused(InvalidRequest):
    """A media part that names a URL the profile's server would fetch from this host
    (docs/security.md#media-from-urls); what it was, for each front's wording."""

    default_code = "remote_media_refused"

    def __init__(self, message: str, *, param: str, kind: str, url: str, model: str) -> None:
        super().__init__(message, param=param)
        self.kind = kind
        self.url = url
        self.model = model


class Unauthenticated(GatewayError):
    """No caller key, or one the gateway does not know (OpenAI's answer to a bad key)."""

    status = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class Forbidden(GatewayError):
    """A known caller asking for what its credential does not allow."""

    status = 403
    error_type = "permission_error"
    default_code = "forbidden"


class ModelNotFound(GatewayError):
    status = 404
    error_type = "invalid_request_error"
    default_code = "model_not_found"


class NotFound(GatewayError):
    """A path the gateway does not serve (or one turned off)."""

    status = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    error_type = "invalid_request_error"
    default_code = "method_not_allowed"


class BodyTooLarge(GatewayError):
    status = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class BodiesOverBudget(GatewayError):
    """A request body that would pass ``limits.max_reading_mib`` of bodies being read."""

    status = 503
    error_type = "server_error"
    default_code = "server_busy"


class BodyTooSlow(GatewayError):
    """A request body that arrived below the minimum rate, or not whole by its deadline."""

    status = 408
    error_type = "invalid_request_error"
    default_code = "request_timeout"


class CallerLeft(GatewayError):
    """The caller closed its connection before its request body was whole: there is no
    one to answer, and nothing went wrong in the gateway (499, nginx's convention, as the
    record of a caller that left mid-answer has it)."""

    status = 499
    error_type = "invalid_request_error"
    default_code = "client_disconnected"


class BudgetExceeded(GatewayError):
    """A call that would start with a budget already spent; never resent by the gateway."""

    status = 429
    error_type = "insufficient_quota"
    default_code = "budget_exceeded"


class BudgetStoreUnavailable(GatewayError):
    """The database several gateways keep their budgets in did not answer, and budgets
    fail closed: the call is not sent (it may be tried again shortly)."""

    status = 503
    error_type = "server_error"
    default_code = "budget_store_unavailable"


class RateStoreUnavailable(GatewayError):
    """The database the rate limits of several gateways are counted in did not answer,
    and they fail closed: the call is not sent (it may be tried again shortly)."""

    status = 503
    error_type = "server_error"
    default_code = "rate_limit_store_unavailable"


class RateLimited(GatewayError):
    """A call over a rate limit (requests or tokens in a window), or one that found no
    place within a concurrency limit's wait: to be sent again after ``Retry-After``.
    ``error_type`` says which, as OpenAI's own: ``requests`` or ``tokens``."""

    status = 429
    error_type = "requests"
    default_code = "rate_limit_exceeded"


class MissingApiKey(GatewayError):
    status = 500
    error_type = "server_error"
    default_code = "missing_api_key"


class InvalidApiKeyConfig(GatewayError):
    """The environment variable a profile names holds a key no header can carry."""

    status = 500
    error_type = "server_error"
    default_code = "invalid_api_key_config"


class InternalError(GatewayError):
    """A fault inside the gateway itself (a bug), answered in OpenAI's shape like any other."""

    status = 500
    error_type = "server_error"
    default_code = "internal_error"


class UpstreamFailure(GatewayError):
    """The upstream answered with an error, or could not be used."""

    status = 502
    error_type = "upstream_error"


class UpstreamUnavailable(UpstreamFailure):
    status = 503
    default_code = "upstream_unavailable"


class UpstreamTimeout(UpstreamFailure):
    status = 504
    default_code = "upstream_timeout"


class MalformedResponse(UpstreamFailure):
    default_code = "malformed_response"


class ResponseTooLarge(UpstreamFailure):
    """An answer past one of ``inference.upstream_limits``; never resent."""

    default_code = "upstream_response_too_large"


class StreamBroken(UpstreamFailure):
    default_code = "upstream_stream_broken"


def internal_error(where: str) -> InternalError:
    """The answer to a fault of the gateway itself, with its traceback logged now.

    Call it inside the ``except`` that caught the fault. The caller is told only
    where to look (``where``: the call id, or the request line), never the fault's
    own text, which may hold anything.
    """
    # a request line holds what the caller chose: a decoded %0a would start a log line
    shown = printable(clip(where))
    log.exception("internal error in %s", shown)
    return InternalError(f"The gateway failed on {shown}; its log has the details")


class ProxyRefused(UpstreamFailure):
    """The HTTP proxy would not carry the request (CONNECT refused, 407); never resent."""

    default_code = "proxy_refused"


REDACTED = "***"
REDACTED_BYTES = REDACTED.encode()


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """Replace every secret (an API key) in ``text`` with ``***``."""
    for secret in secrets:
        if secret and secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact_optional(text: str | None, secrets: tuple[str, ...]) -> str | None:
    return redact(text, secrets) if text is not None else None


def redact_error(exc: GatewayError, secrets: tuple[str, ...]) -> GatewayError:
    """The error with every secret taken out of the fields a caller or a record sees."""
    if secrets:
        exc.message = redact(exc.message, secrets)
        exc.args = (exc.message,)
        exc.type = redact(exc.type, secrets)
        exc.code = redact_optional(exc.code, secrets)
        exc.param = redact_optional(exc.param, secrets)
        exc.headers = {k: redact(v, secrets) for k, v in exc.headers.items()}
    return exc


def secret_forms(secrets: tuple[str, ...]) -> tuple[bytes, ...]:
    """Each secret as it appears inside a JSON string: escaped as JSON escapes it (a key
    of visible ASCII without a quote or a backslash is itself), and with every slash
    escaped too, as some encoders write one."""
    forms: list[bytes] = []
    for secret in secrets:
        if not secret:
            continue
        escaped = orjson.dumps(secret)[1:-1]
        for form in (escaped, escaped.replace(b"/", b"\\/")):
            if form not in forms:
                forms.append(form)
    return tuple(forms)


def redact_bytes(data: bytes, forms: tuple[bytes, ...]) -> bytes:
    """``data`` (JSON on its way to a caller) with every form of a secret replaced.

    A form is replaced only where it begins outside an escape: a key of hex digits
    would otherwise match inside ``\\u0010`` and leave a broken escape behind.
    """
    for form in forms:
        if form in data:
            data = _form_or_escape(form).sub(_redacted_if(form), data)
    return data


def _redacted_if(form: bytes) -> Callable[[re.Match[bytes]], bytes]:
    def replace(match: re.Match[bytes]) -> bytes:
        found = match.group()
        return REDACTED_BYTES if found == form else found

    return replace


@functools.lru_cache(maxsize=64)
def _form_or_escape(form: bytes) -> re.Pattern[bytes]:
    # the form first: a key whose form begins with an escape is matched at it
    return re.compile(re.escape(form) + rb"|\\(?:u[0-9a-fA-F]{4}|.)", re.DOTALL)
