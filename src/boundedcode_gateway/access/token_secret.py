"""Where the token secret comes from: the environment variable ``auth.token_secret_env``
names, or the file ``auth.token_secret_file`` names.

The variable is the process's own environment, fixed when it started: a reload reads
the same value again. The file is read again on every reload, so writing a new secret
to it and reloading revokes every token of the old one. Its first line is the secret
that signs; a second line, the previous secret, still verifies (a rotation's grace,
ended by the next reload without it). The file must be the gateway user's alone.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from boundedcode_gateway.access.tokens import TokenError, secret_bytes
from boundedcode_gateway.config import AuthSettings
from boundedcode_gateway.errors import ConfigError

# a secret and the previous one: more would be a list of tokens' secrets nobody retires
MAX_FILE_SECRETS = 2
# far more than two secrets need: a larger file is not one
MAX_FILE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class TokenSecrets:
    """The secret new tokens are signed with, and the one before it still taken, if any."""

    signing: bytes
    previous: bytes | None = None

    @property
    def verifying(self) -> tuple[bytes, ...]:
        """Every secret a token may be signed with."""
        return (self.signing,) if self.previous is None else (self.signing, self.previous)


def token_secrets(auth: AuthSettings, environ: Mapping[str, str]) -> TokenSecrets | None:
    """The configured token secrets; None when ``auth:`` takes no tokens.

    A secret that is named but cannot be read, or is too short, is a ``ConfigError``: the
    configuration says tokens are in use, and a gateway that refused every one of them
    would fail only later. Reads a file: call it off the event loop once serving.
    """
    if auth.token_secret_file is not None:
        return _from_file(auth.token_secret_file)
    name = auth.token_secret_env
    if name is None:
        return None
    value = environ.get(name)
    if not value:
        raise ConfigError(f"auth.token_secret_env: the environment variable {name} is not set")
    try:
        return TokenSecrets(secret_bytes(value))
    except TokenError as exc:
        raise ConfigError(f"auth.token_secret_env: {name}: {exc}") from None


def _from_file(path: str) -> TokenSecrets:
    where = f"auth.token_secret_file: {path}"
    raw = _read_owner_only(path, where)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ConfigError(f"{where}: the file is empty; write the secret on its first line")
    if len(lines) > MAX_FILE_SECRETS:
        raise ConfigError(
            f"{where}: {len(lines)} lines; give the secret, and at most the previous one "
            "on a second line"
        )
    try:
        found = [secret_bytes(line) for line in lines]
    except TokenError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return TokenSecrets(found[0], found[1] if len(found) > 1 else None)


def _read_owner_only(path: str, where: str) -> bytes:
    """The file's bytes, refused unless it is a regular file of this user's that no one
    else may read or write (checked on the file opened, not on the name)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror}") from None
    try:
        _check_owner_only(os.fstat(fd), path, where)
        raw = _read_up_to(fd, MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_FILE_BYTES} bytes; it holds one secret")
    return raw


def _read_up_to(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:  # each read takes at least a byte, or ends the loop
        chunk = os.read(fd, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _check_owner_only(info: os.stat_result, path: str, where: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{where}: not a regular file")
    if info.st_uid != os.geteuid():
        raise ConfigError(
            f"{where}: owned by uid {info.st_uid}, not by the gateway's user (uid {os.geteuid()})"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"{where}: others may read or write it (mode {mode:04o}); make it the owner's "
            f"alone: chmod 600 {path}"
        )
