"""Strings a caller or an upstream chose, made safe to keep and to show. Pure.

``clip`` bounds what is stored or echoed of such a string; ``printable`` escapes
the characters a terminal acts on (C0 and C1 controls, DEL, and the Unicode
line separators and bidirectional overrides that reorder what is shown), so a
``calls`` table or a report cannot be made to move the cursor, recolour the
screen or hide text.
"""

from __future__ import annotations

# what the call log, the ledger and an error message keep of a name a caller chose
MAX_NAME_CHARS = 256
CLIPPED = "…"

_CONTROLS = [
    *range(0x00, 0x20),
    0x7F,
    *range(0x80, 0xA0),
    0x2028,
    0x2029,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_ESCAPES = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in _CONTROLS}


def clip(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """``text``, or its first ``limit`` characters and an ellipsis."""
    return text if len(text) <= limit else text[:limit] + CLIPPED


def printable(text: str) -> str:
    """``text`` with every control character written as an escape (``\\x1b``, ``\\u202e``)."""
    return text.translate(_ESCAPES)
