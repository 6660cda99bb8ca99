"""Caller keys: made at random, kept by the gateway only as their SHA-256, found in constant time.

A presented key is hashed once and compared with every configured digest, each
comparison with ``hmac.compare_digest`` and none cut short, so how long a lookup
takes does not depend on which key (if any) matched, nor where.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from boundedcode_gateway.call_context import Caller
from boundedcode_gateway.config import KeySettings

KEY_PREFIX = "bcg_"
# 32 random bytes, as url-safe base64 (43 characters)
KEY_BYTES = 32


def new_key() -> str:
    """A fresh caller key: ``bcg_`` and 32 random bytes."""
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


def key_digest(key: str) -> str:
    """The SHA-256 of a key as lower-case hex: what ``auth.keys[].sha256`` holds."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_entry_yaml(name: str, digest: str, models: Sequence[str], admin: bool) -> str:
    """The configuration lines of one key, under ``auth.keys``.

    Every string is written double-quoted (a JSON string is a YAML one): a digest of
    digits only, or with one ``e``, would otherwise be read back as a number.
    """
    lines = [
        "auth:",
        "  keys:",
        f"    - name: {_quoted(name)}",
        f"      sha256: {_quoted(digest)}",
        f"      models: [{', '.join(_quoted(m) for m in models)}]",
    ]
    if admin:
        lines.append("      admin: true")
    return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


@dataclass(frozen=True, slots=True)
class _Entry:
    digest: bytes
    caller: Caller


class KeyRing:
    """The configured keys, each as its digest and the ``Caller`` it stands for (built once)."""

    __slots__ = ("_entries",)

    def __init__(self, keys: Sequence[KeySettings]) -> None:
        self._entries = tuple(
            _Entry(
                bytes.fromhex(k.sha256),
                Caller(
                    name=k.name,
                    kind="key",
                    models=frozenset(k.models),
                    admin=k.admin,
                    budget=k.budget,
                ),
            )
            for k in keys
        )

    def find(self, key: str) -> Caller | None:
        """The caller of ``key``, or None; every digest is compared, whatever matched first."""
        presented = hashlib.sha256(key.encode("utf-8")).digest()
        found: Caller | None = None
        for entry in self._entries:
            if hmac.compare_digest(presented, entry.digest):
                found = entry.caller
        return found
