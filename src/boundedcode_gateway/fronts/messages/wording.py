"""The Messages front's refusals, worded as Anthropic words each case (pure).

Anthropic's 400s name the field by its dotted path, then say what is wrong in the
words of its validator: ``max_tokens: Field required``, ``tools.0.custom.x: Extra
inputs are not permitted``, ``messages.0.content.0.type: Input tag 'x' found using
'type' does not match any of the expected tags: ...``. Clients read these: Claude
Code's fallbacks look for their words. The gateway's ``code`` stays with each, for the
record.
"""

from __future__ import annotations

from collections.abc import Iterable

from boundedcode_gateway.errors import InvalidRequest

# the validator's name of each JSON type a field may need
_TYPE_NAMES = {
    "string": "a valid string",
    "integer": "a valid integer",
    "number": "a valid number",
    "boolean": "a valid boolean",
    "object": "a valid dictionary",
    "array": "a valid list",
}


def field_required(path: str) -> InvalidRequest:
    return InvalidRequest(f"{path}: Field required", param=path, code="missing_required_parameter")


def wrong_type(path: str, kind: str) -> InvalidRequest:
    """A field of the wrong JSON type (``kind``: string, integer, number, boolean,
    object, array)."""
    return InvalidRequest(
        f"{path}: Input should be {_TYPE_NAMES[kind]}", param=path, code="invalid_type"
    )


def invalid(path: str, problem: str) -> InvalidRequest:
    """A value Anthropic refuses for a reason of its own (``problem``, in its words)."""
    return InvalidRequest(f"{path}: {problem}", param=path, code="invalid_value")


def extra_input(path: str) -> InvalidRequest:
    """A field Anthropic's API does not define (at this version)."""
    return InvalidRequest(
        f"{path}: Extra inputs are not permitted", param=path, code="unsupported_field"
    )


def expected_tags(path: str, found: str, expected: Iterable[str]) -> InvalidRequest:
    """A ``type`` that names none of the variants the field takes."""
    tags = ", ".join(f"'{t}'" for t in expected)
    return InvalidRequest(
        f"{path}: Input tag '{found[:60]}' found using 'type' does not match any of the"
        f" expected tags: {tags}",
        param=path,
        code="unsupported_field",
    )


def input_should_be(path: str, values: Iterable[str]) -> InvalidRequest:
    """A value none of the literals the field takes."""
    names = [f"'{v}'" for v in values]
    listed = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
    return InvalidRequest(f"{path}: Input should be {listed}", param=path, code="invalid_value")


def not_served(path: str, what: str) -> InvalidRequest:
    """Something Anthropic's API defines that this gateway cannot serve without changing
    the answer: named, with Anthropic's "not supported" wording."""
    return InvalidRequest(
        f"{path}: {what} is not supported by this gateway (docs/fronts.md)",
        param=path,
        code="unsupported_field",
    )
