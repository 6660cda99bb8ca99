"""``anthropic_version`` of a profile: the newest unless set, a known version only, and
only where the provider speaks Anthropic's API; each mistake names the key and its line."""

from __future__ import annotations

import pytest

from boundedcode_gateway.config import parse_config
from boundedcode_gateway.errors import ConfigError
from boundedcode_gateway.provider_kinds import ANTHROPIC_VERSIONS

CONFIG = """\
models:
  claude:
    provider: anthropic
    model: claude-sonnet-4-5
    api_key_env: ANTHROPIC_API_KEY
  gpt:
    provider: openai
    model: gpt-5.1
    api_key_env: OPENAI_API_KEY
"""


def _with(profile: str, line: str) -> str:
    """The configuration with ``line`` added to the profile's keys."""
    head = f"  {profile}:\n"
    return CONFIG.replace(head, f"{head}    {line}\n")


def test_unset_is_the_newest_version() -> None:
    config = parse_config(CONFIG)
    assert config.models["claude"].anthropic_version is None
    assert config.models["claude"].api_version == ANTHROPIC_VERSIONS[0] == "2026-10-21"
    assert config.models["gpt"].api_version is None


@pytest.mark.parametrize(
    "line",
    [
        "anthropic_version: 2023-06-01",  # YAML reads this as a date
        "anthropic_version: '2023-06-01'",
        'anthropic_version: "2026-10-21"',
    ],
)
def test_a_known_version_is_taken_quoted_or_not(line: str) -> None:
    profile = parse_config(_with("claude", line)).models["claude"]
    assert profile.api_version == line.split(": ")[1].strip("'\"")
    assert profile.anthropic_version == profile.api_version


@pytest.mark.parametrize(
    ("profile", "line", "expected"),
    [
        (
            "claude",
            "anthropic_version: 2024-10-22",
            "<c>:3: models.claude.anthropic_version: '2024-10-22' is not an Anthropic API "
            "version the gateway speaks; use '2026-10-21' or '2023-06-01' (unset: "
            "2026-10-21, the newest)",
        ),
        (
            "claude",
            "anthropic_version: 2026",
            "<c>:3: models.claude.anthropic_version: 2026 is not an Anthropic API version",
        ),
        (
            "gpt",
            "anthropic_version: 2023-06-01",
            "<c>:7: models.gpt.anthropic_version: 'anthropic_version' is only for provider "
            "'anthropic', not 'openai'",
        ),
    ],
)
def test_mistakes_name_the_key_and_its_line(profile: str, line: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_with(profile, line), "<c>")
    assert str(info.value).startswith(expected)
