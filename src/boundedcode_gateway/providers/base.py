"""The seam between the pipeline and the providers.

Defines what every adapter offers (``Upstream``), what a stream translator does
(``StreamTranslator``) and the request and options it is given; what lies under
the adapters (``Capabilities``, ``CallMetrics``, the HTTP client) is in
``upstream/``. The pipeline sees only these; it must not know any provider's
wire format.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from boundedcode_gateway.errors import GatewayError
from boundedcode_gateway.policy.retry import RetryBudget, RetryRules
from boundedcode_gateway.policy.structured import RequestedSchema
from boundedcode_gateway.reasoning_store.backend import CallReasoning
from boundedcode_gateway.upstream.capabilities import Capabilities
from boundedcode_gateway.upstream.metrics import DEFAULT_CAPTURED_BYTES, CallMetrics


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """What the caller asked for that changes how an answer is relayed."""

    stream: bool
    include_usage: bool
    return_progress: bool
    # keep the answer's reasoning for the next turn (the target takes it back)
    capture_reasoning: bool = False
    # keep the answer's text (a schema was sent)
    capture_content: bool = False
    # keep the whole answer as a message (content, reasoning, tool calls)
    capture_answer: bool = False
    # the caller declared it drops what it showed when a discard event arrives, so a
    # broken stream may be answered again in the same response
    understands_discard: bool = False
    # what may be kept of one streamed answer (``inference.upstream_limits.max_captured_mib``)
    max_captured_bytes: int = DEFAULT_CAPTURED_BYTES


@dataclass(frozen=True, slots=True)
class ChatCall:
    """One caller request as the service built it, once, for the adapter to translate."""

    # the caller's body, the gateway's own stream option taken out
    body: dict[str, Any]
    options: RequestOptions
    caps: Capabilities
    # the JSON schema the caller asked for (``response_format``), if any
    schema: RequestedSchema | None
    # the task's stored reasoning, where earlier turns are looked up
    reasoning: CallReasoning
    call_id: str


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One HTTP request to an upstream, translated: its path, joined to where the call goes
    (the profile's ``base_url``, or the root of the local server the call was leased)."""

    path: str
    headers: dict[str, str]
    body: bytes
    # a resend on a fresh connection cannot do the work twice (idempotency key)
    resend_safe: bool = False
    # what the adapter changed on its own account, for the call log (``adjustments``)
    adjustments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartialAnswer:
    """What the caller was shown of an answer that broke off: text only, no tool call."""

    content: str
    reasoning: str
    # the shown chunks' completion id and time, for the chunks that go on with them
    completion_id: str | None = None
    created: int | None = None
    # how many deltas of text were shown: about the tokens already generated
    deltas: int = 0


class StreamTranslator(Protocol):
    """A pure state machine: upstream SSE events in, OpenAI chunk payloads out."""

    metrics: CallMetrics
    content_started: bool
    finished: bool
    progress_seen: bool

    def feed(self, event: str, data: bytes) -> Sequence[bytes]:
        """Consume one event; return the OpenAI chunk payloads (JSON bytes) to relay.

        Raises ``GatewayError`` for an error event inside the stream.
        """
        ...

    def shown_text(self) -> PartialAnswer | None:
        """The text and reasoning relayed so far, when this translator keeps them (for an
        upstream that can continue them); None otherwise. Its tool calls are not part of
        it: the relay holds them back until the finish."""
        ...


@dataclass(frozen=True, slots=True)
class Continuation:
    """A request that has the upstream go on with a partial answer, and the translator
    for its stream (which relays only what follows the partial answer)."""

    request: PreparedRequest
    new_translator: Callable[[], StreamTranslator]


class Upstream(Protocol):
    """One model profile's way to its provider."""

    name: str
    provider: str
    upstream_model: str

    @property
    def retry_rules(self) -> RetryRules:
        """The statuses this kind of upstream answers that are worth sending again."""
        ...

    @property
    def retry_budget(self) -> RetryBudget:
        """The profile's limit on resending."""
        ...

    @property
    def schema_form(self) -> str:
        """The form a JSON schema takes in this provider's request (remembered if refused)."""
        ...

    @property
    def base_url(self) -> str:
        """What the paths of its requests are joined to (a local profile's are joined to
        the root of the server each call is leased instead)."""
        ...

    async def capabilities(self) -> Capabilities:
        """What this profile's model supports (may ask the upstream once)."""
        ...

    def prepare(self, call: ChatCall, send_schema: bool) -> PreparedRequest:
        """Translate the caller's request into the provider's (with the requested schema only
        when ``send_schema``): its path, headers and body; where it goes is not its to say."""
        ...

    def learn_from_refusal(self, status: int, message: str) -> bool:
        """Whether a refusal names something optional this adapter sent, now left out of
        its later requests (the call is then sent once more)."""
        ...

    def stream_translator(self, options: RequestOptions) -> StreamTranslator:
        """A fresh translator for one streamed answer."""
        ...

    def continuation(
        self, sent: PreparedRequest, partial: PartialAnswer, options: RequestOptions
    ) -> Continuation | None:
        """How to have the upstream go on with ``partial``, the answer to ``sent`` that
        broke off; None when it cannot (the answer is then sent again or ends in an error)."""
        ...

    def from_response(self, raw: bytes, metrics: CallMetrics, options: RequestOptions) -> bytes:
        """Translate a non-streamed answer into OpenAI's JSON; fill ``metrics``."""
        ...

    def error_from_response(
        self, status: int, raw: bytes, headers: Mapping[str, str]
    ) -> GatewayError:
        """Map the provider's error answer to the gateway's error tree."""
        ...

    async def readiness(self) -> str | None:
        """None when the profile can take calls now, else why not (cheap: its key is set;
        a local profile's servers at most one short probe, its answer kept for a moment)."""
        ...

    def secrets(self) -> tuple[str, ...]:
        """What must never reach a caller, a record or a log: the profile's API key."""
        ...
