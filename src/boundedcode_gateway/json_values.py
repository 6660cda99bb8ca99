"""Checks of values read from JSON: Python's ``bool`` is an ``int``, JSON's ``true`` is not."""

from __future__ import annotations

from typing import Any, TypeGuard


def is_int(value: Any) -> TypeGuard[int]:
    """An integer, and not ``true`` or ``false``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    """An integer or a float, and not ``true`` or ``false``."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def int_or_none(value: Any) -> int | None:
    """The value if it is an integer (not a boolean), else None."""
    return value if is_int(value) else None
