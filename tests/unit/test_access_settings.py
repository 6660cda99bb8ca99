"""The auth: and limits.allowed_hosts settings: what loads, and each mistake named."""

from __future__ import annotations

import re

import pytest

from boundedcode_gateway.app import _check_listening
from boundedcode_gateway.config import parse_config
from boundedcode_gateway.errors import ConfigError

MODELS = "models: {local: {provider: local, external_url: 'http://127.0.0.1:8080'}}\n"
DIGEST = "ab" * 32


def test_keys_and_hosts_load() -> None:
    config = parse_config(
        "auth:\n"
        "  token_secret_env: GW_SECRET\n"
        "  keys:\n"
        f"    - {{name: ci, sha256: '{DIGEST}', models: [local]}}\n"
        "limits:\n"
        "  allowed_hosts: [gw.corp.internal, 10.0.0.5, '[fd00::1]', 'fd00::2']\n" + MODELS
    )
    assert config.auth is not None and config.auth.keys[0].models == ("local",)
    assert config.limits.allowed_hosts == ("gw.corp.internal", "10.0.0.5", "[fd00::1]", "fd00::2")
    assert parse_config(MODELS).auth is None
    assert config.auth.max_token_ttl_s == 86_400  # a day unless set
    from_file = parse_config(
        "auth: {token_secret_file: /run/gw/secret, max_token_ttl_s: 600}\n" + MODELS
    )
    assert from_file.auth is not None and from_file.auth.takes_tokens
    assert from_file.auth.max_token_ttl_s == 600
    assert parse_config(MODELS).limits.allowed_hosts == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("auth:\n", "auth: 'auth' is empty"),
        (
            "auth: {}\n",
            "auth: 'auth' needs at least one entry under 'keys', a 'token_secret_env' "
            "or a 'token_secret_file'",
        ),
        (
            "auth:\n  keys:\n"
            f"    - {{name: ci, sha256: '{DIGEST}', models: [local]}}\n"
            f"    - {{name: ci, sha256: '{'cd' * 32}', models: [local]}}\n",
            "two keys have the same name 'ci'",
        ),
        (
            "auth:\n  keys:\n"
            f"    - {{name: a, sha256: '{DIGEST}', models: [local]}}\n"
            f"    - {{name: b, sha256: '{DIGEST}', models: [local]}}\n",
            "two keys have the same sha256",
        ),
        (
            f"auth:\n  keys:\n    - {{name: ci, sha256: '{DIGEST.upper()}', models: [local]}}\n",
            "auth.keys.0.sha256: String should match pattern",
        ),
        (
            "auth: {token_secret_env: GW_SECRET, token_secret_file: /run/secret}\n",
            "give 'token_secret_env' or 'token_secret_file', not both",
        ),
        ("auth: {token_secret_file: ''}\n", "auth.token_secret_file: String should have"),
        (
            "auth: {token_secret_env: GW_SECRET, max_token_ttl_s: 0}\n",
            "auth.max_token_ttl_s: Input should be greater than or equal to 1",
        ),
        ("limits: {allowed_hosts: ['http://gw.lan']}\n", "is not a host name or an IP address"),
        ("limits: {allowed_hosts: ['gw.lan:8780']}\n", "is not a host name or an IP address"),
        ("limits: {allowed_hosts: ['10.0.0.5:8780']}\n", "is not a host name or an IP address"),
        ("limits: {allowed_hosts: ['*']}\n", "is not a host name or an IP address"),
    ],
)
def test_mistakes_are_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(text + MODELS)


def test_a_reload_may_not_take_auth_from_a_gateway_listening_off_loopback() -> None:
    models = 'models: {local: {provider: local, external_url: "http://127.0.0.1:9"}}\n'
    keyed = parse_config(
        f'auth: {{keys: [{{name: a, sha256: "{"ab" * 32}", models: ["*"]}}]}}\n' + models
    )
    open_ = parse_config(models)
    with pytest.raises(ConfigError, match="a reload cannot remove auth"):
        _check_listening("0.0.0.0", keyed, open_)
    _check_listening("127.0.0.1", keyed, open_)  # loopback: no keys needed
    _check_listening("0.0.0.0", open_, open_)  # started so with --insecure-no-auth
    _check_listening("0.0.0.0", keyed, keyed)
