"""``key new`` and ``token``: the credentials callers send, made on the command line.

``key new`` prints a new caller key once, with the configuration lines that admit
it (only its SHA-256); ``token`` mints a task-scoped token with the secret the
configuration's ``auth.token_secret_env`` or ``auth.token_secret_file`` names, for no
longer than its ``auth.max_token_ttl_s``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from pydantic import ValidationError

from boundedcode_gateway.access.keys import key_digest, key_entry_yaml, new_key
from boundedcode_gateway.access.token_secret import token_secrets
from boundedcode_gateway.access.tokens import TokenError, mint_task_token, parse_duration
from boundedcode_gateway.call_context import ANY_MODEL
from boundedcode_gateway.clock import utc_iso
from boundedcode_gateway.config import GatewayConfig, KeySettings
from boundedcode_gateway.errors import ConfigError

EXIT_USAGE = 2


def model_names(text: str) -> tuple[str, ...]:
    """``local,claude`` → ``("local", "claude")``."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def run_key_new(name: str, models: Sequence[str], admin: bool) -> int:
    """Print a new key, then the ``auth:`` lines to paste; the key is not shown again."""
    key = new_key()
    digest = key_digest(key)
    try:
        KeySettings(name=name, sha256=digest, models=tuple(models), admin=admin)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error["loc"])
        print(f"boundedcode-gateway key new: --{field}: {error['msg']}", file=sys.stderr)
        return EXIT_USAGE
    print(key)
    print()
    print("# Give the key above to the caller: it is shown only now, the gateway keeps")
    print("# only its SHA-256. Add these lines to the configuration (under an existing")
    print("# auth.keys, only the entry):")
    print(key_entry_yaml(name, digest, models, admin), end="")
    return 0


def run_token(
    config: GatewayConfig, task: str, models: Sequence[str], ttl: str, budget_tokens: int | None
) -> int:
    """Print a task token signed with the configured secret; its scope goes to stderr."""
    if config.auth is None or not config.auth.takes_tokens:
        raise ConfigError(
            "auth.token_secret_env is not set: name the environment variable that holds "
            "the token secret (32 bytes or more) under auth:, or its file as "
            "auth.token_secret_file"
        )
    secrets = token_secrets(config.auth, os.environ)
    assert secrets is not None  # a secret is configured
    unknown = [m for m in models if m != ANY_MODEL and m not in config.models]
    if unknown:
        print(f"boundedcode-gateway token: no such model: {', '.join(unknown)}", file=sys.stderr)
        return EXIT_USAGE
    now = time.time()
    try:
        ttl_s = parse_duration(ttl)
        token = mint_task_token(
            secrets.signing,
            task=task,
            models=models,
            ttl_s=ttl_s,
            budget_tokens=budget_tokens,
            now=now,
            max_ttl_s=config.auth.max_token_ttl_s,
        )
    except TokenError as exc:
        print(f"boundedcode-gateway token: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(token)
    print(
        f"# task {task}, models {', '.join(models)}, valid for {ttl_s} s "
        f"(until {utc_iso(int(now + ttl_s))})",
        file=sys.stderr,
    )
    return 0
