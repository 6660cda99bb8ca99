"""A refused request in OpenAI's own words (pure): the messages, ``param`` and ``code``
OpenAI's API gives for each case, so that an OpenAI-shaped caller's own handling of a
400 (a client's fallback, an SDK's message) reads the gateway's refusal as it reads
OpenAI's. The chat and Responses fronts word their refusals with these.

Where the gateway refuses for a reason of its own, the OpenAI sentence comes first and
the reason follows it (``why``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.text import clip


def kind_of(value: Any) -> str:
    """A JSON value's kind as OpenAI names it in "but got ... instead"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _then(message: str, why: str | None) -> str:
    return message if not why else f"{message} {why}"


def quoted(values: Iterable[str]) -> str:
    """``'a', 'b', and 'c'``: a list as OpenAI's messages write one."""
    items = [f"'{clip(v)}'" for v in values]
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + ", and " + items[-1]


def wrong_type(param: str, expected: str, value: Any) -> InvalidRequest:
    """``expected`` as OpenAI writes it: "an integer", "a string", "a decimal", "an
    object", "an array", "a boolean", "one of a string or an array"."""
    return InvalidRequest(
        f"Invalid type for '{param}': expected {expected}, but got {kind_of(value)} instead.",
        param=param,
        code="invalid_type",
    )


def missing(param: str) -> InvalidRequest:
    return InvalidRequest(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def unknown_parameter(param: str) -> InvalidRequest:
    return InvalidRequest(
        f"Unknown parameter: '{clip(param)}'.", param=clip(param), code="unknown_parameter"
    )


def invalid_value(param: str, value: Any, supported: Iterable[str]) -> InvalidRequest:
    return InvalidRequest(
        f"Invalid value: '{clip(str(value))}'. Supported values are: {quoted(supported)}.",
        param=param,
        code="invalid_value",
    )


def empty_array(param: str) -> InvalidRequest:
    return InvalidRequest(
        f"Invalid '{param}': empty array. Expected an array with minimum length 1, but got an "
        "empty array instead.",
        param=param,
        code="empty_array",
    )


def unsupported_parameter(param: str, why: str | None = None) -> InvalidRequest:
    return InvalidRequest(
        _then(f"Unsupported parameter: '{param}' is not supported with this model.", why),
        param=param,
        code="unsupported_parameter",
    )


def unsupported_value(param: str, value: Any, why: str | None = None) -> InvalidRequest:
    shown = f"'{clip(value)}'" if isinstance(value, str) else clip(str(value))
    return InvalidRequest(
        _then(f"Unsupported value: '{param}' does not support {shown} with this model.", why),
        param=param,
        code="unsupported_value",
    )
