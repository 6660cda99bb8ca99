"""The Gemini upstream: ``generateContent`` with ``x-goog-api-key``, thought signatures kept.

Thin: headers, URL, capabilities and the store lookup; the translation is in
``request.py``, ``response.py`` and ``stream.py``. A stored signature goes back
only to the profile that received it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson

from boundedcode_gateway.config import GatewayConfig, ModelProfile
from boundedcode_gateway.errors import ConfigError, GatewayError
from boundedcode_gateway.policy.retry import RetryRules
from boundedcode_gateway.providers.base import (
    ChatCall,
    PreparedRequest,
    RequestOptions,
    StreamTranslator,
)
from boundedcode_gateway.providers.gemini.request import gemini_path, to_gemini_request
from boundedcode_gateway.providers.gemini.response import error_from_gemini, from_gemini_response
from boundedcode_gateway.providers.gemini.signatures import SIGNATURE_KIND, TurnSignatures
from boundedcode_gateway.providers.gemini.stream import GeminiStreamTranslator
from boundedcode_gateway.providers.translating import TranslatingUpstream
from boundedcode_gateway.upstream.capabilities import Capabilities
from boundedcode_gateway.upstream.http import HttpClient
from boundedcode_gateway.upstream.metrics import CallMetrics

# the reasoning store's file for thought signatures (with the part each one rides on)
REASONING_FILES = {SIGNATURE_KIND: "gemini-signatures.jsonl"}
# 429 RESOURCE_EXHAUSTED, 500 INTERNAL, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED
GEMINI_RETRY = RetryRules(statuses=frozenset({429, 500, 503, 504}), max_attempts=4)
GEMINI_CAPABILITIES = Capabilities(
    streaming=True,
    reasoning_back=True,
    structured_output=True,
    prompt_progress=False,
    source="documentation",
    # every system message joins the one system instruction the API has
    system_messages="joined",
)


class GeminiUpstream(TranslatingUpstream):
    """One model profile served by the Gemini API."""

    RETRY = GEMINI_RETRY
    CAPABILITIES = GEMINI_CAPABILITIES
    SCHEMA_FORM = "responseJsonSchema"

    def __init__(self, name: str, profile: ModelProfile, config: GatewayConfig, http: HttpClient):
        thinking = profile.thinking
        if thinking is not None and None not in (thinking.level, thinking.budget_tokens):
            raise ConfigError(
                f"models.{name}.thinking: set 'level' or 'budget_tokens', not both "
                "(Gemini refuses thinkingLevel with thinkingBudget)"
            )
        super().__init__(name, profile, config, http)

    def prepare(self, call: ChatCall, send_schema: bool) -> PreparedRequest:
        """The ``generateContent`` request, each earlier turn of this profile signed again."""
        stream = call.options.stream

        def lookup(keys: Sequence[str]) -> TurnSignatures | None:
            item = call.reasoning.find(SIGNATURE_KIND, keys)
            # a signature is bound to the model and key that wrote it
            if item is None or item.profile != self.name:
                return None
            return TurnSignatures.from_data(item.data)

        out = to_gemini_request(
            call.body,
            model=self.upstream_model,
            thinking=self._profile.thinking,
            default_max_tokens=self._profile.max_tokens,
            schema=call.schema,
            send_schema=send_schema,
            lookup=lookup,
        )
        headers = {"Content-Type": "application/json", "x-goog-api-key": self._key()}
        if stream:
            headers["Accept"] = "text/event-stream"
        adjustments = {"signature_placeholders": out.placeholders} if out.placeholders else {}
        return PreparedRequest(
            path=gemini_path(self.upstream_model, stream),
            headers=headers,
            body=orjson.dumps(out.body),
            adjustments=adjustments,
        )

    def learn_from_refusal(self, status: int, message: str) -> bool:
        """Nothing optional is left out after a refusal (a refused schema has its own path)."""
        return False

    def stream_translator(self, options: RequestOptions) -> StreamTranslator:
        return GeminiStreamTranslator(options, self.upstream_model, self.secrets())

    def from_response(self, raw: bytes, metrics: CallMetrics, options: RequestOptions) -> bytes:
        return from_gemini_response(raw, metrics, options, self.upstream_model)

    def error_from_response(
        self, status: int, raw: bytes, headers: Mapping[str, str]
    ) -> GatewayError:
        return error_from_gemini(status, raw, self.secrets())
