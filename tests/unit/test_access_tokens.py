"""Task tokens: what is minted reads back, and every way a token can be wrong is a 401."""

from __future__ import annotations

import base64
import hashlib
import hmac

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.access.tokens import (
    TokenClaims,
    TokenError,
    mint_task_token,
    parse_duration,
    verify_task_token,
)
from boundedcode_gateway.config import DEFAULT_MAX_TOKEN_TTL_S, BudgetSettings
from boundedcode_gateway.errors import Unauthenticated

SECRET = b"s" * 32
OTHER_SECRET = b"t" * 32
NOW = 1_750_000_000.0
# the claims of a token that expires in 9 s
SOON = {"id": "x", "task": "t", "models": ["local"], "exp": int(NOW) + 9}


def mint(**overrides: object) -> str:
    args: dict[str, object] = {"task": "t-1", "models": ("local",), "ttl_s": 3600, "now": NOW}
    args.update(overrides)
    return mint_task_token(SECRET, **args)  # type: ignore[arg-type]


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def signed_by(secret: bytes, claims_part: str, prefix: str = "bct1.") -> str:
    signed = prefix + claims_part
    return f"{signed}.{b64(hmac.new(secret, signed.encode(), hashlib.sha256).digest())}"


def refused(
    token: str,
    now: float = NOW,
    secret: bytes = SECRET,
    max_ttl_s: float = DEFAULT_MAX_TOKEN_TTL_S,
) -> str:
    with pytest.raises(Unauthenticated) as info:
        verify_task_token(secret, token, now, max_ttl_s)
    assert info.value.http_status == 401 and info.value.code == "invalid_api_key"
    assert not token or token not in info.value.message
    return info.value.message


task_ids = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=128).filter(
    lambda t: t not in (".", "..")
)


@given(
    task=task_ids,
    models=st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=4),
    ttl_s=st.integers(min_value=1, max_value=DEFAULT_MAX_TOKEN_TTL_S),
    budget=st.none() | st.integers(min_value=1, max_value=10**12),
)
def test_what_is_minted_reads_back(
    task: str, models: list[str], ttl_s: int, budget: int | None
) -> None:
    token = mint_task_token(
        SECRET, task=task, models=models, ttl_s=ttl_s, budget_tokens=budget, now=NOW
    )
    assert token.startswith("bct1.")
    claims = verify_task_token(SECRET, token, NOW + ttl_s - 1)
    assert (claims.task, claims.models, claims.budget_tokens) == (task, tuple(models), budget)
    assert claims.expires_at == int(NOW + ttl_s)
    assert claims.issued_at == int(NOW)


@given(
    max_ttl_s=st.integers(min_value=1, max_value=10**8),
    ttl_s=st.integers(min_value=1, max_value=10**8),
    elapsed_s=st.integers(min_value=0, max_value=10**8),
)
def test_no_token_lives_longer_than_the_maximum(max_ttl_s: int, ttl_s: int, elapsed_s: int) -> None:
    """Minted within the maximum, a token is taken until it expires; minted past it (a
    gateway with a larger maximum, or the setting lowered since), it is refused whenever
    presented: its lifetime is what counts, not what is left of it."""
    token = mint_task_token(
        SECRET, task="t", models=["local"], ttl_s=ttl_s, now=NOW, max_ttl_s=10**8
    )
    now = NOW + elapsed_s
    if elapsed_s >= ttl_s:
        assert "expired" in refused(token, now=now, max_ttl_s=max_ttl_s)
    elif ttl_s > max_ttl_s:
        assert f"lives {ttl_s} s, longer than the {max_ttl_s} s" in refused(
            token, now=now, max_ttl_s=max_ttl_s
        )
    else:
        assert verify_task_token(SECRET, token, now, max_ttl_s).task == "t"


def test_minting_past_the_maximum_is_refused() -> None:
    with pytest.raises(TokenError, match="86401 s is longer than the 86400 s a token may live"):
        mint(ttl_s=DEFAULT_MAX_TOKEN_TTL_S + 1)
    with pytest.raises(TokenError, match=r"auth\.max_token_ttl_s"):
        mint(ttl_s=3601, max_ttl_s=3600)
    assert verify_task_token(SECRET, mint(ttl_s=3600, max_ttl_s=3600), NOW, 3600).task == "t-1"


def legacy_token(exp: float) -> str:
    """A token as minted before tokens carried their issue time."""
    claims = {"id": "old", "task": "t-1", "models": ["local"], "exp": int(exp)}
    return signed_by(SECRET, b64(orjson.dumps(claims)))


def test_a_token_without_an_issue_time_may_have_at_most_the_maximum_left() -> None:
    week = legacy_token(NOW + 7 * 86400)
    assert "lives 604800 s, longer than the 86400 s" in refused(week)
    # its remaining time is its lifetime: within a day of its end it is taken
    assert verify_task_token(SECRET, week, NOW + 6 * 86400).token_id == "old"
    assert verify_task_token(SECRET, legacy_token(NOW + 3600), NOW).issued_at is None


def test_any_of_several_secrets_verifies() -> None:
    token = mint()
    assert verify_task_token((OTHER_SECRET, SECRET), token, NOW).task == "t-1"
    with pytest.raises(Unauthenticated, match="Invalid task token"):
        verify_task_token((OTHER_SECRET,), token, NOW)


def test_each_token_has_its_own_id() -> None:
    ids = {verify_task_token(SECRET, mint(), NOW).token_id for _ in range(20)}
    assert len(ids) == 20


def test_the_caller_of_a_token() -> None:
    claims = TokenClaims("abc", "t-1", ("local", "gpt"), int(NOW), 5000)
    caller = claims.caller()
    assert (caller.name, caller.kind, caller.task, caller.admin) == (
        "token:abc",
        "token",
        "t-1",
        False,
    )
    assert caller.models == frozenset({"local", "gpt"})
    assert caller.budget == BudgetSettings(max_tokens=5000, per="lifetime")
    assert caller.may_use("gpt") and not caller.may_use("claude")
    assert TokenClaims("abc", "t-1", ("local",), int(NOW)).caller().budget is None


def test_an_expired_token_says_so() -> None:
    token = mint(ttl_s=60)
    assert verify_task_token(SECRET, token, NOW + 59).task == "t-1"
    message = refused(token, now=NOW + 60)
    assert "expired" in message and "2025-06-15T15:07:40.000Z" in message


def test_a_token_signed_with_another_secret_is_refused() -> None:
    assert refused(mint(), secret=OTHER_SECRET) == "Invalid task token"


def test_changed_claims_are_refused() -> None:
    token = mint()
    prefix, claims_part, signature = token.split(".")
    claims = orjson.loads(base64.urlsafe_b64decode(claims_part + "=" * (-len(claims_part) % 4)))
    for change in ({"task": "t-2"}, {"models": ["*"]}, {"exp": claims["exp"] + 3600}):
        forged = f"{prefix}.{b64(orjson.dumps({**claims, **change}))}.{signature}"
        assert refused(forged) == "Invalid task token"


@pytest.mark.parametrize(
    "broken",
    [
        lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"),  # signature changed
        lambda t: t.rsplit(".", 1)[0],  # no signature
        lambda t: t.rsplit(".", 1)[0] + ".",  # empty signature
        lambda t: t + "!",  # not base64
        lambda t: "bct2." + t.removeprefix("bct1."),  # another version
        lambda t: t.removeprefix("bct1."),
        lambda t: "",
        lambda t: "bct1.",
        lambda t: t.replace(".", "é", 1),
    ],
)
def test_a_damaged_token_is_refused(broken: object) -> None:
    assert refused(broken(mint())) == "Invalid task token"  # type: ignore[operator]


def test_the_version_prefix_is_signed() -> None:
    claims_part = mint().split(".")[1]
    # the same claims and a valid signature over them under another prefix
    assert refused(signed_by(SECRET, claims_part, prefix="bct2.")) == "Invalid task token"
    assert verify_task_token(SECRET, signed_by(SECRET, claims_part), NOW).task == "t-1"


@pytest.mark.parametrize(
    "claims",
    [
        b"not json",
        b"[1, 2]",
        orjson.dumps({"id": "x", "task": "../etc", "models": ["local"], "exp": 2 * NOW}),
        orjson.dumps({"id": "x", "task": "t", "models": [], "exp": int(2 * NOW)}),
        orjson.dumps({"id": "x", "task": "t", "models": ["local"], "exp": "soon"}),
        orjson.dumps({"id": "x", "task": "t", "models": ["local"], "exp": True}),
        orjson.dumps(
            {"id": "x", "task": "t", "models": ["local"], "exp": int(2 * NOW), "budget_tokens": 0}
        ),
        orjson.dumps({"task": "t", "models": ["local"], "exp": int(2 * NOW)}),
        orjson.dumps(
            {"id": "x", "task": "t", "models": ["local"], "exp": int(NOW) + 9, "iat": "now"}
        ),
        # issued after it expires
        orjson.dumps(
            {"id": "x", "task": "t", "models": ["local"], "exp": int(NOW) + 9, "iat": int(NOW) + 10}
        ),
    ],
)
def test_signed_claims_of_the_wrong_shape_are_refused(claims: bytes) -> None:
    assert refused(signed_by(SECRET, b64(claims))) == "Invalid task token"


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"task": "../etc"}, "not a task id"),
        ({"task": ".."}, "not a task id"),
        ({"models": ()}, "at least one model"),
        ({"models": ("",)}, "at least one model"),
        ({"ttl_s": 0}, "more than 0"),
        ({"budget_tokens": 0}, "at least 1"),
    ],
)
def test_minting_refuses_bad_claims(overrides: dict[str, object], words: str) -> None:
    with pytest.raises(TokenError, match=words):
        mint(**overrides)


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(TokenError, match="31 bytes; it needs at least 32"):
        mint_task_token("x" * 31, task="t", models=["local"], ttl_s=60)
    assert mint_task_token("x" * 32, task="t", models=["local"], ttl_s=60).startswith("bct1.")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("7d", 604800), (" 1h ", 3600)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0h", "2w", "h", "-5m", "1.5h", "2 h"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(TokenError, match="not a duration"):
        parse_duration(text)
