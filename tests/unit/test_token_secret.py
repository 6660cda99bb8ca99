"""The token secret's file: its first line signs, a second still verifies, and a file
another user could read or write is refused, as is one that holds no usable secret."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from boundedcode_gateway.access.token_secret import TokenSecrets, token_secrets
from boundedcode_gateway.config import AuthSettings
from boundedcode_gateway.errors import ConfigError

NEW = "n" * 40
OLD = "o" * 40


def secret_file(tmp_path: Path, text: str | bytes, mode: int = 0o600) -> AuthSettings:
    path = tmp_path / "token-secret"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    path.chmod(mode)
    return AuthSettings(token_secret_file=str(path))


def test_the_first_line_signs_and_a_second_still_verifies(tmp_path: Path) -> None:
    assert token_secrets(secret_file(tmp_path, NEW + "\n"), {}) == TokenSecrets(NEW.encode())
    both = token_secrets(secret_file(tmp_path, f"{NEW}\n\n  {OLD}  \n", 0o400), {})
    assert both == TokenSecrets(NEW.encode(), OLD.encode())
    assert both.verifying == (NEW.encode(), OLD.encode())


def test_the_file_is_read_again_each_time(tmp_path: Path) -> None:
    auth = secret_file(tmp_path, OLD)
    assert token_secrets(auth, {}) == TokenSecrets(OLD.encode())
    assert auth.token_secret_file is not None
    Path(auth.token_secret_file).write_text(NEW)
    assert token_secrets(auth, {}) == TokenSecrets(NEW.encode())


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660])
def test_a_file_others_may_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    with pytest.raises(ConfigError, match=f"mode {mode:04o}.*chmod 600"):
        token_secrets(secret_file(tmp_path, NEW, mode), {})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "the file is empty"),
        ("\n \n", "the file is empty"),
        ("short\n", "the token secret has 5 bytes; it needs at least 32"),
        (f"{NEW}\nshort\n", "the token secret has 5 bytes"),
        (f"{NEW}\n{OLD}\n{'x' * 40}\n", "3 lines; give the secret, and at most the previous"),
        (b"\xff" * 40, "not UTF-8 text"),
        ("x" * 5000, "larger than 4096 bytes"),
    ],
)
def test_a_file_without_a_usable_secret_is_refused(
    tmp_path: Path, text: str | bytes, words: str
) -> None:
    with pytest.raises(ConfigError, match=words) as info:
        token_secrets(secret_file(tmp_path, text), {})
    assert info.value.args[0].startswith("auth.token_secret_file: ")
    assert NEW not in str(info.value) and OLD not in str(info.value)


def test_a_missing_file_or_a_folder_is_refused(tmp_path: Path) -> None:
    missing = AuthSettings(token_secret_file=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="cannot read it: No such file or directory"):
        token_secrets(missing, {})
    folder = tmp_path / "folder"
    folder.mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="not a regular file"):
        token_secrets(AuthSettings(token_secret_file=str(folder)), {})


def test_a_file_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auth = secret_file(tmp_path, NEW)
    # the file is this user's; seen from another user's gateway it is someone else's
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(tmp_path).st_uid + 1)
    with pytest.raises(ConfigError, match=r"owned by uid \d+, not by the gateway's user"):
        token_secrets(auth, {})


def test_the_environment_variable_is_the_other_source() -> None:
    auth = AuthSettings(token_secret_env="GW_SECRET")
    assert token_secrets(auth, {"GW_SECRET": NEW}) == TokenSecrets(NEW.encode())
    with pytest.raises(ConfigError, match="GW_SECRET is not set"):
        token_secrets(auth, {})
