"""Which adapter serves which provider kind: an explicit table, no lookup by convention."""

from __future__ import annotations

from collections.abc import Callable

from boundedcode_gateway.config import GatewayConfig, ModelProfile
from boundedcode_gateway.errors import ConfigError
from boundedcode_gateway.providers.anthropic import adapter as anthropic
from boundedcode_gateway.providers.anthropic.adapter import AnthropicUpstream
from boundedcode_gateway.providers.base import Upstream
from boundedcode_gateway.providers.gemini import adapter as gemini
from boundedcode_gateway.providers.gemini.adapter import GeminiUpstream
from boundedcode_gateway.providers.openai_compat import adapter as openai_compat
from boundedcode_gateway.providers.openai_compat.adapter import OpenAICompatUpstream
from boundedcode_gateway.upstream.http import HttpClient

UpstreamFactory = Callable[[str, ModelProfile, GatewayConfig, HttpClient], Upstream]

FACTORIES: dict[str, UpstreamFactory] = {
    "local": OpenAICompatUpstream,
    "openai": OpenAICompatUpstream,
    "openai-compatible": OpenAICompatUpstream,
    "anthropic": AnthropicUpstream,
    "gemini": GeminiUpstream,
}

# each kind of reasoning the adapters keep → its file in a task's folder
REASONING_FILES: dict[str, str] = {
    **openai_compat.REASONING_FILES,
    **anthropic.REASONING_FILES,
    **gemini.REASONING_FILES,
}


def build_upstream(
    name: str, profile: ModelProfile, config: GatewayConfig, http: HttpClient
) -> Upstream:
    """The upstream of one model profile; a kind without an adapter is a ``ConfigError``."""
    factory = FACTORIES.get(profile.provider)
    if factory is None:
        raise ConfigError(
            f"models.{name}.provider: {profile.provider!r} is not available in this version"
        )
    return factory(name, profile, config, http)
