"""The OpenAI-shaped kinds as data rows: one row per kind, no branches elsewhere."""

from __future__ import annotations

from dataclasses import dataclass

from boundedcode_gateway.config import ReasoningHistory
from boundedcode_gateway.policy.retry import RetryRules
from boundedcode_gateway.upstream.capabilities import CapabilitySource

# llama.cpp answers 500 when the model wrote a malformed tool call: a new sample
# usually parses, so up to 3 attempts in all
LOCAL_RETRY = RetryRules(statuses=frozenset({500}), max_attempts=3)
# OpenAI's own SDK resends these; 529 is the overload status of some services
CLOUD_RETRY = RetryRules(
    statuses=frozenset({408, 409, 429, 500, 502, 503, 504, 529}),
    max_attempts=4,
    never_codes=frozenset({"insufficient_quota"}),
)


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one kind of OpenAI-shaped server differs from the others."""

    name: str
    capability_source: CapabilitySource
    # None: the chat template decides (llama.cpp's chat_template_caps)
    reasoning_under_auto: bool | None
    reasoning_under_keep: bool
    prompt_progress: bool
    # requests carry an Idempotency-Key so a resend on a fresh connection is safe
    idempotency_key: bool
    # llama-server reads only string tool_choice values; an object silently means "auto"
    tool_choice_string_only: bool
    retry: RetryRules
    # a schema goes in OpenAI's strict form (llama.cpp reads only json_schema.schema)
    strict_schema: bool = True
    # under `keep`, tool-call turns always carry reasoning_content ("" when none is known):
    # DeepSeek and Kimi refuse them without it
    reasoning_on_tool_turns_under_keep: bool = False
    # the server goes on with a partial answer given as the final assistant message
    # (continuation.py); an answer that broke off in text is continued, not sent again
    continues_after_break: bool = False

    def takes_reasoning(self, setting: ReasoningHistory, template_preserves: bool) -> bool:
        """Whether earlier reasoning goes back to this kind under ``setting``."""
        if setting == "drop":
            return False
        if setting == "keep":
            return self.reasoning_under_keep
        if self.reasoning_under_auto is None:
            return template_preserves
        return self.reasoning_under_auto


LLAMA_CPP = Dialect(
    name="llama.cpp",
    capability_source="props",
    reasoning_under_auto=None,
    reasoning_under_keep=True,
    prompt_progress=True,
    idempotency_key=True,
    tool_choice_string_only=True,
    retry=LOCAL_RETRY,
    strict_schema=False,
    continues_after_break=True,
)

LOCAL_OPENAI_COMPATIBLE = Dialect(
    name="local-openai-compatible",
    capability_source="assumed",
    reasoning_under_auto=False,
    reasoning_under_keep=True,
    prompt_progress=False,
    idempotency_key=True,
    tool_choice_string_only=False,
    retry=LOCAL_RETRY,
    reasoning_on_tool_turns_under_keep=True,
)

OPENAI = Dialect(
    name="openai",
    capability_source="documentation",
    reasoning_under_auto=False,
    reasoning_under_keep=False,
    prompt_progress=False,
    idempotency_key=False,
    tool_choice_string_only=False,
    retry=CLOUD_RETRY,
)

OPENAI_COMPATIBLE = Dialect(
    name="openai-compatible",
    capability_source="documentation",
    reasoning_under_auto=False,
    reasoning_under_keep=True,
    prompt_progress=False,
    idempotency_key=False,
    tool_choice_string_only=False,
    retry=CLOUD_RETRY,
    reasoning_on_tool_turns_under_keep=True,
)

DIALECT_BY_PROVIDER: dict[str, Dialect] = {
    "openai": OPENAI,
    "openai-compatible": OPENAI_COMPATIBLE,
    # a local server is llama.cpp until /props says otherwise
    "local": LOCAL_OPENAI_COMPATIBLE,
}
