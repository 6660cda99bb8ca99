"""The adapter for every OpenAI-shaped upstream; the kinds differ only by their ``Dialect`` row.

For ``provider: local`` it is handed the servers' traits (``LocalServers``, read once
by the profile's local fleet): a llama.cpp server's decide the capabilities and the
form of its requests; another local OpenAI-compatible server has assumed capabilities.
It translates; it asks no server anything itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from boundedcode_gateway.config import GatewayConfig, ModelProfile
from boundedcode_gateway.errors import GatewayError, InvalidRequest
from boundedcode_gateway.policy.capabilities import check_media
from boundedcode_gateway.policy.mid_system import ADJUSTMENT as FOLDED_ADJUSTMENT
from boundedcode_gateway.policy.mid_system import fold_system_messages
from boundedcode_gateway.policy.reasoning import REASONING_KIND, StoredReasoning
from boundedcode_gateway.policy.retry import RetryBudget, RetryRules
from boundedcode_gateway.policy.volatile_lines import ADJUSTMENT as VOLATILE_ADJUSTMENT
from boundedcode_gateway.policy.volatile_lines import strip_system_messages
from boundedcode_gateway.providers.base import (
    ChatCall,
    Continuation,
    PartialAnswer,
    PreparedRequest,
    RequestOptions,
    StreamTranslator,
)
from boundedcode_gateway.providers.openai_compat.continuation import continuation_body
from boundedcode_gateway.providers.openai_compat.dialects import (
    DIALECT_BY_PROVIDER,
    LLAMA_CPP,
    Dialect,
)
from boundedcode_gateway.providers.openai_compat.mapping import (
    error_from_openai_compat,
    from_openai_compat_response,
    to_openai_compat_request,
)
from boundedcode_gateway.providers.openai_compat.stream import OpenAIStreamTranslator
from boundedcode_gateway.upstream.capabilities import Capabilities
from boundedcode_gateway.upstream.http import HttpClient
from boundedcode_gateway.upstream.metrics import CallMetrics
from boundedcode_gateway.upstream.profile_key import bearer_headers
from boundedcode_gateway.upstream.server_traits import LocalServers, ServerTraits

log = logging.getLogger(__name__)

# the reasoning store's file for reasoning text, in each task's folder
REASONING_FILES = {REASONING_KIND: "local-replay.jsonl"}
# a request rendered to count its tokens, never sent
_COUNT_OPTIONS = RequestOptions(stream=False, include_usage=False, return_progress=False)


def capabilities_from_traits(
    traits: ServerTraits,
    takes_reasoning: bool,
    refusal: str | None = None,
    media_urls: bool = False,
) -> Capabilities:
    """llama.cpp's capabilities, from what its ``/props`` and template showed
    (``media_urls``: the profile lets media parts name URLs for the server to fetch)."""
    return Capabilities(
        streaming=True,
        reasoning_back=takes_reasoning,
        structured_output=True,
        prompt_progress=True,
        source="props",
        tools=traits.tools,
        vision=traits.vision,
        audio=traits.audio,
        video=traits.video,
        media_urls=media_urls,
        context_tokens=traits.context_tokens,
        reasoning_back_refusal=refusal,
        continue_after_break=traits.continues,
        system_messages="in_place" if traits.system_in_place else "folded",
    )


class OpenAICompatUpstream:
    """One model profile served by an OpenAI-shaped API."""

    def __init__(
        self,
        name: str,
        profile: ModelProfile,
        config: GatewayConfig,
        http: HttpClient,
        servers: LocalServers | None = None,
    ):
        self.name = name
        self.provider: str = profile.provider
        self.upstream_model = profile.model or name
        self._profile = profile
        self._setting = config.reasoning_history_for(profile)
        self._dialect: Dialect = DIALECT_BY_PROVIDER[profile.provider]
        self._template_preserves = False
        # sent with a reasoning budget where the template writes "\n</think>"
        self._budget_message: str | None = None
        self._caps: Capabilities | None = None
        self._caps_lock = asyncio.Lock()
        # a local profile's servers, whose traits decide the capabilities
        self._servers = servers
        self._budget = RetryBudget(profile.retry.max_attempts, profile.retry.max_total_s)

    def _own_slot_only(self, out: dict[str, Any]) -> None:
        """Where the gateway pins each call to a slot, the caller names none (and, under
        cache isolation, asks for no further choices)."""
        if self._profile.cache_isolation != "none":
            _keep_to_own_slot(out)
        elif self._servers is not None and self._servers.pins_slots:
            # pinned to its conversation's slot (slot files): a slot the caller names
            # would put it in another conversation's
            _without_own_slot(out)

    @property
    def retry_rules(self) -> RetryRules:
        return self._dialect.retry

    @property
    def retry_budget(self) -> RetryBudget:
        return self._budget

    @property
    def schema_form(self) -> str:
        return "response_format"

    @property
    def base_url(self) -> str:
        return self._profile.upstream_base_url

    def _assumed(self) -> Capabilities:
        d = self._dialect
        return Capabilities(
            streaming=True,
            reasoning_back=d.takes_reasoning(self._setting, self._template_preserves),
            structured_output=True,
            prompt_progress=d.prompt_progress,
            source=d.capability_source,
            # a cloud API takes system messages anywhere; a local server that is not
            # llama.cpp has a template the gateway cannot probe: folded, which any takes
            system_messages="folded" if self.provider == "local" else "in_place",
            media_urls=self._profile.takes_media_urls,
        )

    async def capabilities(self) -> Capabilities:
        """Read once; a local server that cannot be reached yet is asked again next time."""
        if self._caps is not None:
            return self._caps
        servers = self._servers
        if servers is None:
            self._caps = self._assumed()
            return self._caps
        async with self._caps_lock:
            if self._caps is None:
                traits = await servers.traits()
                self._caps = self._from_traits(traits) if traits is not None else None
            return self._caps or self._assumed()

    def _from_traits(self, traits: ServerTraits) -> Capabilities:
        if not traits.llama_cpp:
            return self._assumed()
        self._dialect = LLAMA_CPP
        self._template_preserves = traits.keeps_reasoning
        self._budget_message = traits.budget_message
        takes = self._dialect.takes_reasoning(self._setting, self._template_preserves)
        refusal = None if takes else traits.reasoning_refusal
        if refusal is not None and self._setting == "auto":
            log.warning("model %s: earlier reasoning cannot go back: %s", self.name, refusal)
        else:
            refusal = None
        return capabilities_from_traits(traits, takes, refusal, self._profile.takes_media_urls)

    def _continues(self) -> bool:
        caps = self._caps
        return (
            self._dialect.continues_after_break and caps is not None and caps.continue_after_break
        )

    def secrets(self) -> tuple[str, ...]:
        return self._profile.secrets()

    def prepare(self, call: ChatCall, send_schema: bool) -> PreparedRequest:
        """The HTTP request for this upstream, earlier reasoning restored where it is taken."""

        def lookup(keys: Sequence[str]) -> StoredReasoning | None:
            item = call.reasoning.find(REASONING_KIND, keys)
            if item is None or not isinstance(item.data, str):
                return None
            return StoredReasoning(item.profile, item.data)

        stream = call.options.stream
        out = to_openai_compat_request(
            call.body,
            model=self.upstream_model,
            dialect=self._dialect,
            options=call.options,
            takes_reasoning=call.caps.reasoning_back,
            profile=self.name,
            lookup=lookup,
            required_on_tool_turns=(
                self._setting == "keep" and self._dialect.reasoning_on_tool_turns_under_keep
            ),
            schema=call.schema,
            send_schema=send_schema,
        )
        adjustments: dict[str, Any] = {}
        self._own_slot_only(out)
        if self.provider == "local":
            # a local server's cache: a line new on every request would stop the match there
            messages, removed = strip_system_messages(out["messages"])
            if removed:
                out["messages"] = messages
                adjustments[VOLATILE_ADJUSTMENT] = removed
        if call.caps.system_messages == "folded":
            # after the volatile lines are out: a folded block is a user turn's text
            messages, folded = fold_system_messages(out["messages"])
            out["messages"] = messages
            if folded:
                adjustments[FOLDED_ADJUSTMENT] = folded
        if self._budget_message is not None and _needs_budget_message(out):
            out["reasoning_budget_message"] = self._budget_message
            adjustments["reasoning_budget_message"] = self._budget_message
        body = orjson.dumps(out)
        headers = {"Content-Type": "application/json"}
        if self._servers is None:
            # a local server's credentials are those of the server the call goes to
            headers.update(self._auth_headers())
        if stream:
            headers["Accept"] = "text/event-stream"
        if self._dialect.idempotency_key:
            headers["Idempotency-Key"] = call.call_id
        return PreparedRequest(
            # a local server's root has the API under /v1; a cloud's base URL names it
            path="/v1/chat/completions" if self._servers is not None else "/chat/completions",
            headers=headers,
            body=body,
            resend_safe=self._dialect.idempotency_key,
            adjustments=adjustments,
        )

    def _auth_headers(self) -> dict[str, str]:
        return bearer_headers(self.name, self._profile)

    def learn_from_refusal(self, status: int, message: str) -> bool:
        return False  # the caller's fields pass through: a refusal is the caller's to see

    def stream_translator(self, options: RequestOptions) -> StreamTranslator:
        return OpenAIStreamTranslator(options, self.secrets(), keep_shown=self._continues())

    def continuation(
        self, sent: PreparedRequest, partial: PartialAnswer, options: RequestOptions
    ) -> Continuation | None:
        """llama.cpp goes on with a partial text answer given as the final message."""
        body = continuation_body(sent.body, partial) if self._continues() else None
        if body is None:
            return None
        secrets = self.secrets()
        return Continuation(
            dataclasses.replace(sent, body=body, adjustments={}),
            lambda: OpenAIStreamTranslator(options, secrets, continuing=partial),
        )

    def from_response(self, raw: bytes, metrics: CallMetrics, options: RequestOptions) -> bytes:
        return from_openai_compat_response(
            raw, metrics, options.capture_reasoning, options.capture_content, options.capture_answer
        )

    def error_from_response(
        self, status: int, raw: bytes, headers: Mapping[str, str]
    ) -> GatewayError:
        return error_from_openai_compat(status, raw, self.secrets())

    async def token_count_request(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The request whose prompt a llama.cpp server counts for a chat-completions
        ``body``: the messages as a call would send them (without reasoning the store would
        restore); None for any other server or service. The template's rendering loads
        the media parts as a call does, so they are held to the same rules first."""
        caps = await self.capabilities()
        if self._dialect is not LLAMA_CPP:
            return None
        check_media(body, caps, self.name)
        out = to_openai_compat_request(
            body,
            model=self.upstream_model,
            dialect=self._dialect,
            options=_COUNT_OPTIONS,
            takes_reasoning=caps.reasoning_back,
            profile=self.name,
        )
        out["messages"] = strip_system_messages(out["messages"])[0]
        if caps.system_messages == "folded":
            out["messages"] = fold_system_messages(out["messages"])[0]
        return out

    async def readiness(self) -> str | None:
        """A key the profile names is set; a local profile's servers are ready."""
        missing = self._profile.key_missing()
        if missing is not None:
            return missing
        if self._servers is not None:
            return await self._servers.readiness()
        return None


# the fields that would run a call in a slot the gateway did not give it: a slot named by
# the caller, and further choices (``n``, ``n_cmpl``), which llama-server runs in other
# free slots
_OWN_SLOT_FIELDS = ("id_slot",)
_CHOICE_FIELDS = ("n", "n_cmpl")


def _without_own_slot(out: dict[str, Any]) -> None:
    """A caller's ``id_slot`` taken out: the gateway pins the call to its conversation's."""
    for key in _OWN_SLOT_FIELDS:
        out.pop(key, None)


def _keep_to_own_slot(out: dict[str, Any]) -> None:
    """Under cache isolation a call runs in its group's slot alone: a caller's ``id_slot``
    is taken out (the gateway pins the call), and more than one choice is refused."""
    _without_own_slot(out)
    for key in _CHOICE_FIELDS:
        value = out.get(key)
        if value is not None and value != 1:
            raise InvalidRequest(
                f"'{key}' must be 1 on this model: its prompt cache is kept per "
                "caller, and further choices would run in other callers' slots",
                param=key,
            )


def _needs_budget_message(body: dict[str, Any]) -> bool:
    budget = body.get("reasoning_budget_tokens")
    return isinstance(budget, int) and budget >= 0 and "reasoning_budget_message" not in body
