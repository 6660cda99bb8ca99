"""Checks of values read from JSON: Python's ``bool`` is an ``int``, JSON's ``true`` is not;
and how deep a caller's JSON may be nested."""

from __future__ import annotations

from typing import Any, TypeGuard

from boundedcode_gateway.errors import InvalidRequest

# the largest token count kept (2**53 - 1: exact as a float, and far above any real count)
MAX_COUNT = 2**53 - 1
# JSON nested deeper than this is refused where the gateway cannot encode it again: orjson
# reads up to 1024 levels but writes at most 254, and the adapters nest a little further
NESTING_LIMIT = 200
# how much of a too-deep field's path the error names
_NESTING_PARAM_PARTS = 4


def is_int(value: Any) -> TypeGuard[int]:
    """An integer, and not ``true`` or ``false``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    """An integer or a float, and not ``true`` or ``false``."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def int_or_none(value: Any) -> int | None:
    """The value if it is an integer (not a boolean), else None."""
    return value if is_int(value) else None


def count_or_none(value: Any) -> int | None:
    """A count an upstream reported (tokens): a non-negative integer, at most ``MAX_COUNT``;
    None for anything else.

    orjson reads integers up to 2**64 - 1 and SQLite stores them up to 2**63 - 1: one
    upstream's absurd ``usage`` must not make its call's record, and the records written
    with it, fail to store. A sum of a few such counts stays within both.
    """
    if not is_int(value) or value < 0:
        return None
    return min(value, MAX_COUNT)


def nesting_error(body: Any, limit: int = NESTING_LIMIT) -> InvalidRequest | None:
    """The 400 for a body nested more than ``limit`` levels deep, naming where; else None.

    A walk over every container: run only once encoding the body has failed, never on
    the way of a call that succeeds.
    """
    stack: list[tuple[Any, int, tuple[str, ...]]] = [(body, 1, ())]
    while stack:
        value, depth, path = stack.pop()
        if depth > limit:
            param = "".join(path[:_NESTING_PARAM_PARTS]).lstrip(".")
            return InvalidRequest(
                f"Invalid '{param}': JSON nested more than {limit} levels deep.",
                param=param,
                code="nested_too_deeply",
            )
        if isinstance(value, dict):
            stack.extend(
                (v, depth + 1, (*path, f".{k}"))
                for k, v in value.items()
                if isinstance(v, dict | list)
            )
        elif isinstance(value, list):
            stack.extend(
                (v, depth + 1, (*path, f"[{i}]"))
                for i, v in enumerate(value)
                if isinstance(v, dict | list)
            )
    return None


def raise_if_too_deep(body: Any) -> None:
    """After encoding ``body`` failed (orjson raises a plain ``TypeError``): its 400 when it
    is nested too deep; otherwise the failure is the gateway's own and is left to raise."""
    error = nesting_error(body)
    if error is not None:
        raise error from None
