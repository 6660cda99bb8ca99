"""The record of one call: what the call log line and the ledger row hold.

Owns the field list and its order; it must not do I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from boundedcode_gateway.trace_context import TraceContext

# the purpose of a token count's record: a caller's request, but no model call (nothing
# generated, nothing spent); as the cache repairs' own, a caller may not send it
TOKEN_COUNT_PURPOSE = "token_count"
# the purpose of a slot save's record: the gateway's own work for a conversation (its
# slot written to its slot file, docs/llama-server.md), no model call
SLOT_SAVE_PURPOSE = "slot_save"
# the purposes of the gateway's own records, besides its cache repairs
# (policy/cache_misses.py): never a caller's turn, and never a caller's to send
OWN_RECORD_PURPOSES = frozenset({TOKEN_COUNT_PURPOSE, SLOT_SAVE_PURPOSE})


@dataclass(slots=True)
class CallRecord:
    """One caller request, successful or not; written exactly once."""

    call_id: str
    started_at: str  # UTC, ISO 8601 with milliseconds and a Z
    task: str
    purpose: str
    model_profile: str
    provider: str | None = None
    upstream_model: str | None = None
    stream: bool = False
    # "ok" | "error" | "abandoned" (the gateway's own work that gave way to a caller's call)
    status: str = "error"
    http_status: int = 0
    error_code: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    evaluated_tokens: int | None = None
    ttft_ms: float | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    total_ms: float | None = None
    messages: int = 0
    changed: int | None = None
    retried: bool = False
    attempts: int = 0
    # "sent", "dropped_after_rejection", "skipped_known_rejection"; None without a schema
    structured_output: str | None = None
    schema_valid: bool | None = None
    # the cache: what the previous call of the conversation left reusable (its prompt and
    # generated tokens), and why the prompt was not served from it (policy/cache_misses.py)
    reusable_tokens: int | None = None
    miss_cause: str | None = None
    # true when ttft_ms comes from the server's own timings (a non-streamed answer)
    ttft_derived: bool = False
    # the caller's key name or task token name (auth:); None when the gateway has no auth
    caller: str | None = None
    # the profile's price applied to this call's tokens (and time); None without a price
    cost_usd: float | None = None
    # the local server that answered (of a pool: docs/scaling.md); None for a cloud API
    server: str | None = None
    # the API the caller spoke: "chat" (chat completions), "messages", "responses"
    front: str = "chat"
    # the tokens of the conversation's slot file loaded into its slot before the call,
    # and the milliseconds that took; the milliseconds the call waited for the slot's
    # earlier conversation to be saved (docs/llama-server.md, "Slot files")
    restored_tokens: int | None = None
    slot_restore_ms: float | None = None
    slot_save_ms: float | None = None
    # call log only: why a slot file bought nothing ("file_refused: …", "reevaluated",
    # "prefix_diverged"); None when it worked or there was none
    restore_failure: str | None = None
    # call log only: a digest of the requests' first message, which tells a client's side
    # requests (a title, a summary) from the task's main conversation; llama.cpp profiles
    conversation: str | None = None
    # call log only: each attempt's {"status", "code"}, in order
    attempt_log: list[dict[str, Any]] = field(default_factory=list)
    # call log only: what the adapter changed in the request on its own account
    # (a placeholder thought signature, a forced tool choice relaxed, reasoning replayed)
    adjustments: dict[str, Any] = field(default_factory=dict)
    # call log only: where the prompt stopped matching ({"message", "char"}), where known
    miss_at: dict[str, int] | None = None
    # call log only: the error's message, clipped (the gateway's words, or the upstream's
    # with its key redacted); None for a call that did not fail
    error_message: str | None = None
    # call log only: the prompt tokens the provider wrote to its cache (Anthropic's
    # cache_creation_input_tokens), where it says
    cache_write_tokens: int | None = None
    # call log only: the llama-server slot the call held, under cache isolation
    slot: int | None = None
    # call log only: the call's span in its trace, when the gateway exports traces
    trace: TraceContext | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(CallRecord))
# the ledger keeps each call's final outcome; the per-attempt detail is in the call log
CALL_LOG_ONLY = frozenset(
    {
        "attempt_log",
        "adjustments",
        "miss_at",
        "error_message",
        "restore_failure",
        "conversation",
        "cache_write_tokens",
        "slot",
        "trace",
    }
)
LEDGER_FIELDS: tuple[str, ...] = tuple(f for f in RECORD_FIELDS if f not in CALL_LOG_ONLY)
# a record a sink could not hold, and why
Rejected = tuple[CallRecord, Exception]
