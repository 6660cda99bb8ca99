"""The gateway's errors in Anthropic's shape (pure): ``{"type": "error", "error": {"type",
"message"}}`` with the status Anthropic gives that kind of error.

Anthropic's statuses differ from the gateway's in two places: an overload is 529
(the gateway's 503), and a 4xx without a kind of its own is ``invalid_request_error``.
A prompt longer than the context is a 400 worded as Anthropic words it ("prompt is
too long: N tokens > M maximum"), which Claude Code reads to compact its history.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from boundedcode_gateway.errors import GatewayError, RemoteMediaRefused
from boundedcode_gateway.unique_ids import base62_id

OVERFLOW_CODE = "context_length_exceeded"
# the response header Anthropic names each request by (also the error body's request_id)
REQUEST_ID_HEADER = "request-id"
# Anthropic's kinds of error by the status it answers them with (docs: API errors)
TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# the gateway's 503 (upstream unavailable, overloaded) is Anthropic's overload
STATUS_FOR = {503: 529}
# an error inside a stream has no status: the one its code or type stands for
STATUS_BY_CODE = {
    "upstream_unavailable": 503,
    "upstream_timeout": 504,
    OVERFLOW_CODE: 400,
    "budget_exceeded": 429,
}
STATUS_BY_TYPE = {
    **{kind: status for status, kind in TYPE_BY_STATUS.items()},
    "insufficient_quota": 429,
}

# the counts in each wording the gateway meets: the prompt's, then the context's
_TOKENS_THEN_LIMIT: tuple[re.Pattern[str], ...] = (
    # llama.cpp: "request (N tokens) exceeds the available context size (M tokens)"
    re.compile(r"\((\d+) tokens\) exceeds the available context size \((\d+) tokens\)"),
    # Anthropic: "prompt is too long: N tokens > M maximum"
    re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum"),
    # Gemini: "The input token count (N) exceeds the maximum number of tokens allowed (M)"
    re.compile(
        r"input token count \((\d+)\) exceeds the maximum number of tokens allowed"
        r" \((\d+)"
    ),
)
# and the wordings that give the context's first
_LIMIT_THEN_TOKENS: tuple[re.Pattern[str], ...] = (
    # OpenAI: "maximum context length is M tokens. However, your messages resulted in N tokens"
    re.compile(
        r"maximum context length is (\d+) tokens\. However, your messages resulted in"
        r" (\d+)"
    ),
)


def prompt_too_long(message: str) -> str:
    """An overflow's message as Anthropic words it, with the counts where the upstream
    gave them."""
    for pattern in _TOKENS_THEN_LIMIT:
        found = pattern.search(message)
        if found:
            return f"prompt is too long: {found[1]} tokens > {found[2]} maximum"
    for pattern in _LIMIT_THEN_TOKENS:
        found = pattern.search(message)
        if found:
            return f"prompt is too long: {found[2]} tokens > {found[1]} maximum"
    return f"prompt is too long: {message}"


def anthropic_status(status: int) -> tuple[int, str]:
    """(Anthropic's status, its error type) for an error the gateway answers with ``status``."""
    status = STATUS_FOR.get(status, status)
    kind = TYPE_BY_STATUS.get(status)
    if kind is None:
        kind = "invalid_request_error" if status < 500 else "api_error"
    return status, kind


def error_body(kind: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def new_request_id() -> str:
    """An id in the form of Anthropic's ``request_id`` (``req_`` and 24 base-62 digits:
    unique, not secret)."""
    return "req_" + base62_id(24)


# the gateway's wording of a model it does not serve, and of a missing or unknown key
_NO_MODEL = re.compile(r"^The model '(.*)' does not exist on this gateway$", re.S)
_ANTHROPIC_WORDS = {
    # Anthropic's 401s, which its clients show as they come
    "No API key given": "x-api-key header is required",
    "Invalid API key": "invalid x-api-key",
    # Anthropic's 413 (its edge's wording)
    "request_too_large": "Request exceeds the maximum allowed number of bytes.",
}


def anthropic_message(exc: GatewayError) -> str:
    """An error's message in Anthropic's words where Anthropic has words for that case
    (an unknown model, a missing or invalid key, a body too large, an overflow, a
    media URL refused);
    the gateway's otherwise."""
    if exc.code == OVERFLOW_CODE:
        return prompt_too_long(exc.message)
    if exc.code == "model_not_found":
        found = _NO_MODEL.match(exc.message)
        return f"model: {found[1]}" if found else exc.message
    if exc.code == "request_too_large":
        return _ANTHROPIC_WORDS["request_too_large"]
    if isinstance(exc, RemoteMediaRefused):
        return remote_media_refused(exc)
    if exc.http_status == 401:
        for start, words in _ANTHROPIC_WORDS.items():
            if exc.message.startswith(start):
                return words
    return exc.message


def remote_media_refused(exc: RemoteMediaRefused) -> str:
    """A media block whose source is a URL, refused for a profile whose server would fetch
    it: said of the block's ``source``, as Anthropic's validator names a block's field
    (the only such block a Messages request can hold is an image's)."""
    return (
        f"source.type: a source of type 'url' is not supported for the model '{exc.model}'"
        f" on this gateway: send the {exc.kind} as a source of type 'base64' (the"
        f" model's server would fetch '{exc.url}' from the gateway's host; the"
        " profile's remote_media is refuse)"
    )


def from_gateway_error(exc: GatewayError) -> tuple[int, bytes]:
    """The status and body of a gateway error, as Anthropic answers it: with a
    ``request_id`` in the body and, as ``request-id``, among the error's headers."""
    status, kind = anthropic_status(exc.http_status)
    message = anthropic_message(exc)
    request_id = exc.headers.setdefault(REQUEST_ID_HEADER, new_request_id())
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}
    return status, orjson.dumps(body)


def from_stream_error(error: Any) -> bytes:
    """The ``error`` event's data for the gateway's in-stream error object (OpenAI's
    ``{"message", "type", "param", "code"}``): a server fault is ``api_error``, an
    overload ``overloaded_error``, as Anthropic's streams send them, and Claude Code
    and the SDKs retry both."""
    if not isinstance(error, dict):
        return error_body("api_error", str(error))
    code, kind = error.get("code"), error.get("type")
    message = str(error.get("message") or kind or "the answer failed")
    status = None
    if isinstance(code, str):
        # an Anthropic upstream's own kind (an overload mid-stream) is its code
        status = STATUS_BY_CODE.get(code) or STATUS_BY_TYPE.get(code)
    if status is None:
        status = STATUS_BY_TYPE.get(kind, 500) if isinstance(kind, str) else 500
    if code == OVERFLOW_CODE:
        message = prompt_too_long(message)
    return error_body(anthropic_status(status)[1], message)
