"""The adapter for Anthropic's Messages API: the HTTP edge around the pure translation.

Thinking blocks this profile's model wrote come back from the task's store
into each request; blocks of another profile or provider never do.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from boundedcode_gateway.config import GatewayConfig, ModelProfile
from boundedcode_gateway.errors import GatewayError
from boundedcode_gateway.policy.retry import RetryRules
from boundedcode_gateway.providers.anthropic.request import (
    AnthropicTarget,
    ThinkingBlocks,
    to_anthropic_request,
)
from boundedcode_gateway.providers.anthropic.response import (
    THINKING_KIND,
    error_from_anthropic,
    from_anthropic_response,
)
from boundedcode_gateway.providers.anthropic.stream import AnthropicStreamTranslator
from boundedcode_gateway.providers.anthropic.versions import (
    NEWEST,
    SAMPLING_FIELDS,
    removed_fields,
)
from boundedcode_gateway.providers.base import (
    ChatCall,
    PreparedRequest,
    RequestOptions,
    StreamTranslator,
)
from boundedcode_gateway.providers.translating import TranslatingUpstream
from boundedcode_gateway.upstream.capabilities import Capabilities
from boundedcode_gateway.upstream.http import HttpClient
from boundedcode_gateway.upstream.metrics import CallMetrics

log = logging.getLogger(__name__)

# the reasoning store's file for thinking blocks, byte for byte, in each task's folder
REASONING_FILES = {THINKING_KIND: "anthropic-thinking.jsonl"}
# under 2023-06-01, newer models refuse sampling parameters on their own account
SAMPLING_REFUSAL = re.compile(r"\b(temperature|top_p|top_k)\b")
# Anthropic's SDK resends these; 529 is its overload. A spent budget (429) is final.
ANTHROPIC_RETRY = RetryRules(
    statuses=frozenset({408, 409, 429, 500, 502, 503, 504, 529}),
    max_attempts=4,
    never_codes=frozenset({"enforced_spend_limit_reached"}),
)
ANTHROPIC_CAPABILITIES = Capabilities(
    streaming=True,
    reasoning_back=True,
    structured_output=True,
    prompt_progress=False,
    source="documentation",
    # every system message joins the one system instruction the API has
    system_messages="joined",
)


def stored_blocks(data: Any) -> ThinkingBlocks | None:
    """The store's ``[[position, block], ...]`` as the translation takes it."""
    if not isinstance(data, list):
        return None
    out: ThinkingBlocks = []
    for item in data:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[1], dict):
            out.append((int(item[0]), item[1]))
    return out or None


class AnthropicUpstream(TranslatingUpstream):
    """One model profile served by Anthropic (or a server that speaks its Messages API)."""

    RETRY = ANTHROPIC_RETRY
    CAPABILITIES = ANTHROPIC_CAPABILITIES
    SCHEMA_FORM = "output_config.format"

    def __init__(self, name: str, profile: ModelProfile, config: GatewayConfig, http: HttpClient):
        super().__init__(name, profile, config, http)
        self._version = profile.api_version or NEWEST
        self._target = AnthropicTarget(
            self.upstream_model, profile.max_tokens, profile.thinking, self._version
        )
        # set once the model refused temperature / top_p / top_k: they are left out from then
        # on; a version that removed them has nothing to learn
        self._sampling_refused = False
        self._sampling_removed = removed_fields(self._version) >= set(SAMPLING_FIELDS)

    def prepare(self, call: ChatCall, send_schema: bool) -> PreparedRequest:
        """The Messages API request, with this profile's earlier thinking put back."""
        stream = call.options.stream

        def lookup(keys: Sequence[str]) -> ThinkingBlocks | None:
            item = call.reasoning.find(THINKING_KIND, keys)
            if item is None or item.profile != self.name or item.provider != self.provider:
                return None
            return stored_blocks(item.data)

        translated = to_anthropic_request(
            call.body,
            self._target,
            stream=stream,
            lookup=lookup,
            schema=call.schema if send_schema else None,
            sampling=not self._sampling_refused,
        )
        headers = {
            "content-type": "application/json",
            # an API key goes here under every version (Authorization is for OAuth tokens)
            "x-api-key": self._key(),
            "anthropic-version": self._version,
        }
        if stream:
            headers["accept"] = "text/event-stream"
        return PreparedRequest(
            path="/messages",
            headers=headers,
            body=orjson.dumps(translated.body),
            adjustments=translated.adjustments,
        )

    def learn_from_refusal(self, status: int, message: str) -> bool:
        """A model that refuses sampling parameters gets none from now on."""
        if (
            status != 400
            or self._sampling_refused
            or self._sampling_removed
            or not SAMPLING_REFUSAL.search(message)
        ):
            return False
        self._sampling_refused = True
        log.warning(
            "model %s refuses sampling parameters; they are left out from now on", self.name
        )
        return True

    def stream_translator(self, options: RequestOptions) -> StreamTranslator:
        return AnthropicStreamTranslator(options, self.secrets())

    def from_response(self, raw: bytes, metrics: CallMetrics, options: RequestOptions) -> bytes:
        return from_anthropic_response(raw, metrics, options.capture_content)

    def error_from_response(
        self, status: int, raw: bytes, headers: Mapping[str, str]
    ) -> GatewayError:
        return error_from_anthropic(status, raw, self.secrets())
