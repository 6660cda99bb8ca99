"""The provider kinds a model profile may name, and what each needs in its profile.

A leaf table: the configuration checks profiles against it and the registry
gives each kind its adapter, so neither has a kind's facts written into its code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ProviderKind = Literal["local", "openai", "openai-compatible", "anthropic", "gemini"]

# the Messages API versions (``anthropic-version``) an Anthropic profile may name, newest
# first: the newest is what a profile that names none speaks
ANTHROPIC_VERSIONS = ("2026-10-21", "2023-06-01")


@dataclass(frozen=True, slots=True)
class KindRules:
    """What a profile of one provider kind must or may set."""

    # the URL requests go to when the profile sets no ``base_url`` ("" when it must)
    default_base_url: str = ""
    needs_api_key: bool = False
    needs_base_url: bool = False
    # ``thinking`` and ``max_tokens``: the kinds whose own API the gateway translates to
    takes_thinking: bool = False
    # ``external_url``, ``model_path`` and ``server``: a server on this machine
    local: bool = False
    # ``anthropic_version``: the API versions a profile may pin, newest first (none: the
    # kind takes no such key)
    anthropic_versions: tuple[str, ...] = ()


KINDS: dict[str, KindRules] = {
    "local": KindRules(local=True),
    "openai": KindRules(default_base_url="https://api.openai.com/v1", needs_api_key=True),
    "openai-compatible": KindRules(needs_base_url=True),
    "anthropic": KindRules(
        default_base_url="https://api.anthropic.com/v1",
        needs_api_key=True,
        takes_thinking=True,
        anthropic_versions=ANTHROPIC_VERSIONS,
    ),
    "gemini": KindRules(
        default_base_url="https://generativelanguage.googleapis.com/v1beta",
        needs_api_key=True,
        takes_thinking=True,
    ),
}


def kinds_that(rule: str) -> list[str]:
    """The kinds whose rules have ``rule`` set, in the table's order."""
    return [kind for kind, rules in KINDS.items() if getattr(rules, rule)]
