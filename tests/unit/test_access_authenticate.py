"""From the Authorization header to the caller: keys, tokens, and what each may do."""

from __future__ import annotations

import pytest

from boundedcode_gateway.access.authenticate import (
    Authenticator,
    check_model,
    metered_task,
)
from boundedcode_gateway.access.keys import key_digest
from boundedcode_gateway.access.token_secret import TokenSecrets, token_secrets
from boundedcode_gateway.access.tokens import mint_task_token
from boundedcode_gateway.call_context import Caller
from boundedcode_gateway.config import AuthSettings, KeySettings
from boundedcode_gateway.errors import ConfigError, Forbidden, Unauthenticated

KEY = "bcg_the-ci-key"
SECRET = "a-token-secret-of-32-bytes-at-least"
NOW = 1_750_000_000.0
AUTH = AuthSettings(
    token_secret_env="GW_TOKEN_SECRET",
    keys=(KeySettings(name="ci", sha256=key_digest(KEY), models=("local",)),),
)


def authenticator(auth: AuthSettings = AUTH) -> Authenticator:
    secrets = token_secrets(auth, {"GW_TOKEN_SECRET": SECRET})
    return Authenticator(auth, secrets, clock=lambda: NOW)


def refusal(header: str | None, auth: AuthSettings = AUTH) -> Unauthenticated:
    with pytest.raises(Unauthenticated) as info:
        authenticator(auth).caller(header)
    exc = info.value
    assert (exc.http_status, exc.code) == (401, "invalid_api_key")
    assert exc.headers == {"WWW-Authenticate": "Bearer"}
    return exc


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_a_key_is_its_caller(scheme: str) -> None:
    caller = authenticator().caller(f"{scheme} {KEY}")
    assert (caller.name, caller.kind, caller.task) == ("ci", "key", None)


def test_a_token_is_its_caller() -> None:
    token = mint_task_token(SECRET, task="t-7", models=["local"], ttl_s=60, now=NOW)
    caller = authenticator().caller(f"Bearer {token}")
    assert caller.kind == "token" and caller.task == "t-7"
    assert caller.name.startswith("token:")


@pytest.mark.parametrize(
    ("header", "words"),
    [
        (None, "No API key given"),
        (f"Basic {KEY}", "must be 'Bearer <key>'"),
        (KEY, "must be 'Bearer <key>'"),
        ("Bearer", "must be 'Bearer <key>'"),
        ("Bearer ", "Invalid API key"),
        ("Bearer bcg_not-the-key", "Invalid API key"),
        (f"Bearer {key_digest(KEY)}", "Invalid API key"),
    ],
)
def test_no_key_or_a_wrong_one_is_401(header: str | None, words: str) -> None:
    exc = refusal(header)
    assert words in exc.message
    assert KEY not in exc.message and "not-the-key" not in exc.message


def test_tokens_need_a_secret() -> None:
    token = mint_task_token(SECRET, task="t", models=["local"], ttl_s=60, now=NOW)
    keys_only = AuthSettings(keys=AUTH.keys)
    assert "does not accept task tokens" in refusal(f"Bearer {token}", keys_only).message


def test_an_expired_token_is_401() -> None:
    token = mint_task_token(SECRET, task="t", models=["local"], ttl_s=60, now=NOW - 60)
    assert "expired" in refusal(f"Bearer {token}").message


def test_the_secret_is_read_from_the_environment() -> None:
    assert token_secrets(AUTH, {"GW_TOKEN_SECRET": SECRET}) == TokenSecrets(SECRET.encode())
    assert token_secrets(AuthSettings(keys=AUTH.keys), {}) is None
    with pytest.raises(ConfigError, match="GW_TOKEN_SECRET is not set"):
        token_secrets(AUTH, {})
    with pytest.raises(ConfigError, match="GW_TOKEN_SECRET: the token secret has 5 bytes"):
        token_secrets(AUTH, {"GW_TOKEN_SECRET": "short"})


def test_a_token_longer_lived_than_the_maximum_in_force_is_401() -> None:
    token = mint_task_token(SECRET, task="t", models=["local"], ttl_s=7200, now=NOW, max_ttl_s=7200)
    assert authenticator().caller(f"Bearer {token}").task == "t"
    hour = AUTH.model_copy(update={"max_token_ttl_s": 3600})
    assert "lives 7200 s, longer than the 3600 s" in refusal(f"Bearer {token}", hour).message


def test_the_previous_secret_still_verifies_and_signs_nothing() -> None:
    old = mint_task_token(SECRET, task="t", models=["local"], ttl_s=60, now=NOW)
    rotated = Authenticator(AUTH, TokenSecrets(b"n" * 32, SECRET.encode()), clock=lambda: NOW)
    assert rotated.caller(f"Bearer {old}").task == "t"
    revoked = Authenticator(AUTH, TokenSecrets(b"n" * 32), clock=lambda: NOW)
    with pytest.raises(Unauthenticated, match="Invalid task token"):
        revoked.caller(f"Bearer {old}")


KEY_CALLER = Caller(name="ci", kind="key", models=frozenset({"local"}))
ANY_CALLER = Caller(name="ops", kind="key", models=frozenset({"*"}))
TOKEN_CALLER = Caller(name="token:x", kind="token", models=frozenset({"local"}), task="t-7")


def test_models_outside_the_credential_are_403() -> None:
    check_model(KEY_CALLER, "local")
    check_model(ANY_CALLER, "claude")
    with pytest.raises(Forbidden) as info:
        check_model(KEY_CALLER, "claude")
    assert (info.value.http_status, info.value.code, info.value.param) == (
        403,
        "model_not_allowed",
        "model",
    )


def test_a_token_is_metered_under_its_own_task_only() -> None:
    assert metered_task(TOKEN_CALLER, None) == "t-7"
    assert metered_task(TOKEN_CALLER, "t-7") == "t-7"
    with pytest.raises(Forbidden) as info:
        metered_task(TOKEN_CALLER, "t-8")
    assert (info.value.http_status, info.value.code) == (403, "task_mismatch")
    # a key names any task, or none
    assert metered_task(KEY_CALLER, "t-8") == "t-8"
    assert metered_task(KEY_CALLER, None) is None
