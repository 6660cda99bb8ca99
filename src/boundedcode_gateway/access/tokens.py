"""Task-scoped tokens: signed claims a sandbox sends instead of a caller key.

A token is ``bct1.<claims>.<signature>``: the claims are JSON in url-safe
base64 (no padding), the signature HMAC-SHA256 with the gateway's token secret
over ``bct1.<claims>``, so the version prefix is signed too. The claims say
which task the token is for, which models it may use, when it was issued and
when it expires, the token budget it carries, if any, and a random id that
names it in records. Only the holder of the secret can make one; nothing about
a token is stored. No token lives longer than ``auth.max_token_ttl_s``: one
asked for is refused at minting, one made anyway is refused when presented.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from boundedcode_gateway.call_context import TASK_ID, Caller
from boundedcode_gateway.clock import utc_iso
from boundedcode_gateway.config import DEFAULT_MAX_TOKEN_TTL_S, BudgetSettings
from boundedcode_gateway.errors import Unauthenticated

TOKEN_PREFIX = "bct1."
# a shorter secret would be the weak part of a SHA-256 HMAC
MIN_SECRET_BYTES = 32
_ID_BYTES = 9  # 12 characters: unique among the tokens of one secret, not secret itself
_DURATION = re.compile(r"(\d+)([smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class TokenError(ValueError):
    """A token cannot be made from these arguments (the message says which)."""


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a token grants."""

    token_id: str
    task: str
    models: tuple[str, ...]
    expires_at: int  # seconds since the epoch
    budget_tokens: int | None = None
    # seconds since the epoch; None: made before tokens said when they were issued
    issued_at: int | None = None

    def caller(self) -> Caller:
        budget = (
            BudgetSettings(max_tokens=self.budget_tokens, per="lifetime")
            if self.budget_tokens is not None
            else None
        )
        return Caller(
            name=f"token:{self.token_id}",
            kind="token",
            models=frozenset(self.models),
            task=self.task,
            budget=budget,
        )


def parse_duration(text: str) -> int:
    """``90``, ``90s``, ``30m``, ``2h``, ``7d`` in seconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or int(match.group(1)) <= 0:
        raise TokenError(f"not a duration: {text!r} (use a number with s, m, h or d, as in 2h)")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def secret_bytes(secret: str | bytes) -> bytes:
    """The secret as bytes, refused when shorter than 32 bytes."""
    raw = secret.encode("utf-8") if isinstance(secret, str) else secret
    if len(raw) < MIN_SECRET_BYTES:
        raise TokenError(
            f"the token secret has {len(raw)} bytes; it needs at least {MIN_SECRET_BYTES}"
        )
    return raw


def mint_task_token(
    secret: str | bytes,
    *,
    task: str,
    models: Sequence[str],
    ttl_s: float,
    budget_tokens: int | None = None,
    now: float | None = None,
    max_ttl_s: float = DEFAULT_MAX_TOKEN_TTL_S,
) -> str:
    """A token for ``task`` and ``models``, valid for ``ttl_s`` seconds from ``now``;
    refused longer than ``max_ttl_s``, which a gateway's ``auth.max_token_ttl_s`` holds
    it to (give that setting's value where it is not the default)."""
    key = secret_bytes(secret)
    if not TASK_ID.fullmatch(task) or task in (".", ".."):
        raise TokenError(f"not a task id: {task!r} (1 to 128 of A-Z a-z 0-9 . _ -)")
    names = tuple(models)
    if not names or not all(isinstance(m, str) and m for m in names):
        raise TokenError("a token needs at least one model name")
    if ttl_s <= 0:
        raise TokenError("the time to live must be more than 0 seconds")
    if ttl_s > max_ttl_s:
        raise TokenError(
            f"a time to live of {int(ttl_s)} s is longer than the {int(max_ttl_s)} s a token "
            "may live (auth.max_token_ttl_s)"
        )
    if budget_tokens is not None and budget_tokens < 1:
        raise TokenError("the token budget must be at least 1")
    issued = time.time() if now is None else now
    claims: dict[str, Any] = {
        "id": secrets.token_urlsafe(_ID_BYTES),
        "task": task,
        "models": list(names),
        "iat": int(issued),
        "exp": int(issued + ttl_s),
    }
    if budget_tokens is not None:
        claims["budget_tokens"] = budget_tokens
    signed = TOKEN_PREFIX + _b64(orjson.dumps(claims))
    return f"{signed}.{_b64(_signature(key, signed))}"


def is_token(credential: str) -> bool:
    """Whether a credential is a task token (rather than a caller key)."""
    return credential.startswith(TOKEN_PREFIX)


def verify_task_token(
    secret: bytes | Iterable[bytes],
    token: str,
    now: float,
    max_ttl_s: float = DEFAULT_MAX_TOKEN_TTL_S,
) -> TokenClaims:
    """The claims of a token signed with ``secret`` (or any of several), not expired and
    living no longer than ``max_ttl_s``, or ``Unauthenticated``.

    The signature is checked before anything of the claims is read. A token without an
    issue time (made before tokens had one) may have at most ``max_ttl_s`` left to run.
    """
    signed, dot, signature = token.rpartition(".")
    if not dot or not signed.startswith(TOKEN_PREFIX):
        raise _invalid()
    try:
        presented = _unb64(signature)
    except ValueError:
        raise _invalid() from None
    keys = (secret,) if isinstance(secret, bytes) else tuple(secret)
    signed_by_one = False
    for key in keys:
        # every secret is tried: how long this takes does not say which one signed
        signed_by_one |= hmac.compare_digest(presented, _signature(key, signed))
    if not signed_by_one:
        raise _invalid()
    try:
        claims = _claims(orjson.loads(_unb64(signed[len(TOKEN_PREFIX) :])))
    except ValueError:
        # signed by the secret yet unreadable: made by something other than mint_task_token
        raise _invalid() from None
    if now >= claims.expires_at:
        raise _expired(claims.expires_at)
    issued = claims.issued_at if claims.issued_at is not None else now
    if claims.expires_at - issued > max_ttl_s:
        raise _too_long(claims.expires_at - issued, max_ttl_s)
    return claims


def _claims(data: Any) -> TokenClaims:
    if not isinstance(data, dict):
        raise ValueError("claims are not an object")
    token_id, task, models, exp = (data.get(k) for k in ("id", "task", "models", "exp"))
    budget, iat = data.get("budget_tokens"), data.get("iat")
    if not isinstance(token_id, str) or not isinstance(task, str) or not TASK_ID.fullmatch(task):
        raise ValueError("bad id or task")
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
        raise ValueError("bad models")
    if type(exp) is not int or (budget is not None and (type(budget) is not int or budget < 1)):
        raise ValueError("bad expiry or budget")
    if iat is not None and (type(iat) is not int or iat > exp):
        raise ValueError("bad issue time")
    return TokenClaims(token_id, task, tuple(models), exp, budget, iat)


def _signature(secret: bytes, signed: str) -> bytes:
    return hmac.new(secret, signed.encode("ascii", "replace"), hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        padded = text + "=" * (-len(text) % 4)
        return base64.b64decode(padded, altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not url-safe base64") from exc


def _invalid() -> Unauthenticated:
    # one message for every way a token can be wrong: it tells a forger nothing
    return Unauthenticated("Invalid task token")


def _too_long(lifetime_s: float, max_ttl_s: float) -> Unauthenticated:
    return Unauthenticated(
        f"The task token lives {int(lifetime_s)} s, longer than the {int(max_ttl_s)} s this "
        "gateway allows; ask for a shorter one"
    )


def _expired(expires_at: int) -> Unauthenticated:
    return Unauthenticated(f"The task token expired at {utc_iso(expires_at)}; ask for a new one")
