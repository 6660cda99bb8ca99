"""What the adapters that translate to a provider's own API share (Anthropic, Gemini).

The profile's name, upstream model, API key and retry budget; no continuing an
answer that broke off. Each adapter adds its
translation, its retry rules and capabilities.
"""

from __future__ import annotations

from typing import ClassVar

from boundedcode_gateway.config import GatewayConfig, ModelProfile
from boundedcode_gateway.errors import MissingApiKey
from boundedcode_gateway.policy.retry import RetryBudget, RetryRules
from boundedcode_gateway.providers.base import (
    Continuation,
    PartialAnswer,
    PreparedRequest,
    RequestOptions,
)
from boundedcode_gateway.upstream.capabilities import Capabilities
from boundedcode_gateway.upstream.http import HttpClient


class TranslatingUpstream:
    """The shared half of a translating adapter: identity, key, budget, and the provider's
    documented rules and capabilities (class constants of each adapter)."""

    RETRY: ClassVar[RetryRules]
    CAPABILITIES: ClassVar[Capabilities]
    SCHEMA_FORM: ClassVar[str]

    def __init__(self, name: str, profile: ModelProfile, config: GatewayConfig, http: HttpClient):
        self.name = name
        self.provider: str = profile.provider
        self.upstream_model = profile.model or name
        self._profile = profile
        self._http = http
        self._budget = RetryBudget(profile.retry.max_attempts, profile.retry.max_total_s)

    @property
    def retry_rules(self) -> RetryRules:
        return self.RETRY

    @property
    def retry_budget(self) -> RetryBudget:
        return self._budget

    @property
    def schema_form(self) -> str:
        return self.SCHEMA_FORM

    @property
    def base_url(self) -> str:
        return self._profile.upstream_base_url

    async def capabilities(self) -> Capabilities:
        return self.CAPABILITIES

    def continuation(
        self, sent: PreparedRequest, partial: PartialAnswer, options: RequestOptions
    ) -> Continuation | None:
        return None  # these APIs have no way to go on with an answer that broke off

    async def readiness(self) -> str | None:
        """Ready when its API key is set (the provider is not called to find out)."""
        return self._profile.key_missing()

    def _key(self) -> str:
        """The API key; a call without it is a clear 500 naming the variable."""
        key = self._profile.api_key()
        if key is None:
            raise MissingApiKey(
                f"model '{self.name}' needs the environment variable "
                f"{self._profile.api_key_env}, which is not set"
            )
        return key

    def secrets(self) -> tuple[str, ...]:
        return self._profile.secrets()
