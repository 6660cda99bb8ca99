"""After each llama.cpp answer, off the request path: what the server cached, and its repair.

The server's cache holds the tokens the model *sampled*; the next request is text,
which the server tokenises into the canonical split. Where the model sampled a
non-canonical split (or the template renders the turn differently from what was
generated), the next prompt stops matching inside the previous answer and the rest
of that answer is evaluated again while the caller waits.

Once an answer is done, the keeper reads the slot that served it (``GET /slots``:
its prompt and raw generated text), renders the conversation as the next request
will (``POST /apply-template``), compares the two (``AnswerEvidence``) and, unless
turned off, evaluates that canonical rendering (``POST /completion`` with
``n_predict: 0``), so the next turn finds its prefix cached. The repair runs only
while a slot is idle, and a call arriving for the server abandons it. Each repair
is metered under the purpose ``cache_repair``. Where calls are pinned to slots (slot
files, ``cache_isolation``) the repair runs in the slot that served the answer, held
as a call holds it, and only while that slot is free and still the conversation's: it
writes no other conversation's slot.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import orjson

from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.config import PriceSettings
from boundedcode_gateway.errors import GatewayError
from boundedcode_gateway.json_values import count_or_none
from boundedcode_gateway.llama_server.api import LlamaServerAPI, MalformedAnswer, ServerRefused
from boundedcode_gateway.llama_server.pool import SlotHold
from boundedcode_gateway.llama_server.slots import SlotKey, SlotTable
from boundedcode_gateway.metering.bus import RecordSink
from boundedcode_gateway.metering.meter import Meter
from boundedcode_gateway.policy.cache_misses import (
    MISS_TOLERANCE_TOKENS,
    REPAIR_PURPOSE,
    AnswerEvidence,
    MissReport,
    PreviousCall,
    common_prefix_length,
    token_ends_after,
)
from boundedcode_gateway.policy.media import media_parts
from boundedcode_gateway.pools.server_state import ServerState
from boundedcode_gateway.trace_context import TraceContext

log = logging.getLogger(__name__)

# A message the next request will not hold: the rendering is cut where it begins.
_SENTINEL = "\u2063boundedcode-next-message\u2063"


# the conversations whose renderings are kept to evaluate again after a restart, and the
# longest rendering kept (characters: a 100k-token history is some 400k)
REWARM_CONVERSATIONS = 16
REWARM_MAX_CHARS = 2_000_000


@dataclass(frozen=True, slots=True)
class Rendered:
    """What a conversation's next call starts with, for its slot to be evaluated again."""

    text: str
    group: str | None
    task: str


@dataclass(frozen=True, slots=True)
class AnsweredCall:
    """One successful call to a llama.cpp server, as the keeper needs it."""

    task: str
    purpose: str
    profile: str
    # the server that answered (of a pool, the one the call went to), and its name
    root: str
    server: str | None
    sent_body: bytes  # the request the server answered (reasoning already restored)
    answer: dict[str, Any]  # the answer as the next request will carry it back
    answer_had_reasoning: bool
    reasoning_back: bool  # whether the next request carries the answer's reasoning
    previous: PreviousCall  # where the evidence goes, for the conversation's next call
    # under cache isolation, the slot that served it (the repair goes there or nowhere)
    slot: SlotHold | None = None
    # the server's state, which counts the repair as work that gives way to calls
    state: ServerState | None = None
    # the call's span in its trace: the repair's is its child
    trace: TraceContext | None = None


def next_request_messages(messages: list[Any], answer: dict[str, Any]) -> list[Any]:
    """The conversation so far and a stand-in for the message that will follow the answer:
    a tool result after tool calls, else a user message (templates render an answer
    differently depending on what follows it)."""
    calls = answer.get("tool_calls")
    if isinstance(calls, list) and calls:
        first = calls[0] if isinstance(calls[0], dict) else {}
        follow: dict[str, Any] = {
            "role": "tool",
            "tool_call_id": str(first.get("id") or "call_0"),
            "content": _SENTINEL,
        }
    else:
        follow = {"role": "user", "content": _SENTINEL}
    return [*messages, answer, follow]


def cut_at_sentinel(prompt: str) -> str | None:
    """The rendering up to where the stand-in message's text begins."""
    at = prompt.find(_SENTINEL)
    return prompt[:at] if at >= 0 else None


def pick_slot(slots: Any, prompt: str) -> dict[str, Any] | None:
    """The idle slot whose last prompt was this answer's (its text is shown only while the
    server runs with ``LLAMA_SERVER_SLOTS_DEBUG=1``, and only to a request with the
    server's key; the detokenised text may carry a BOS)."""
    if not isinstance(slots, list):
        return None
    for slot in slots:
        if not isinstance(slot, dict) or slot.get("is_processing"):
            continue
        text = slot.get("prompt")
        if isinstance(text, str) and text.endswith(prompt):
            return slot
    return None


def text_evidence(
    prompt: str,
    generated: str,
    rendered: str,
    answer_had_reasoning: bool,
    reasoning_back: bool,
    content: str = "",
) -> AnswerEvidence:
    """Whether the next request renders the answer as it was generated, and where not.

    ``content`` is the answer's text as it goes back (its reasoning aside)."""
    shared = common_prefix_length(prompt + generated, rendered)
    if shared >= len(prompt) + len(generated):
        return AnswerEvidence("match")
    dropped = answer_had_reasoning and not reasoning_back
    if shared < len(prompt):
        # A generation prompt that opens the reasoning block (``<think>\n``) belongs to the
        # answer's reasoning: a turn sent back without it may render without that opening,
        # the answer's text straight where the block was. Anything else is an earlier part
        # rendered differently (a template that drops earlier reasoning).
        answer = content.strip()
        skipped = bool(answer) and rendered[shared:].lstrip().startswith(answer)
        if dropped and skipped:
            return AnswerEvidence("reasoning_dropped", diverged_at=0)
        return AnswerEvidence("template_render", diverged_at=0)
    return AnswerEvidence(
        "reasoning_dropped" if dropped else "template_render", diverged_at=shared - len(prompt)
    )


def repair_report(previous: PreviousCall, cache_n: int) -> MissReport:
    """The repair record's own cause: what it found in the slot's cache."""
    evidence = previous.evidence
    reusable = previous.reusable_tokens
    if evidence is None:
        return MissReport(reusable, "server")
    if evidence.verdict in ("template_render", "reasoning_dropped"):
        at = {"message": previous.answer_index}
        if evidence.diverged_at is not None:
            at["char"] = evidence.diverged_at
        return MissReport(reusable, evidence.verdict, at)
    if reusable - cache_n <= MISS_TOLERANCE_TOKENS:
        return MissReport(reusable, "none")
    if evidence.verdict == "match" and previous.prompt_tokens <= cache_n:
        at = {"message": previous.answer_index}
        char = evidence.char_of_token(previous.prompt_tokens, cache_n)
        if char is not None:
            at["char"] = char
        return MissReport(reusable, "token_split", at)
    return MissReport(reusable, "server")


class CacheKeeper:
    """The follow-up of one llama.cpp profile's answers; one job at a time per answer."""

    def __init__(
        self,
        profile: str,
        api: LlamaServerAPI,
        repair: bool,
        writer: RecordSink,
        price: PriceSettings | None = None,
    ) -> None:
        self._profile = profile
        # a reload may change it for the repairs that follow
        self.price = price
        # the servers' own client (their keys), as the pool that leases them has it
        self._api = api
        self._writer = writer
        self._repair = repair
        self._jobs: set[asyncio.Task[None]] = set()
        self._repairing: set[asyncio.Task[None]] = set()
        # per server, the conversations it served last and the rendering their next call
        # starts with: what a server started again evaluates in the background where
        # its slots cannot be restored (most recent last)
        self._recent: OrderedDict[tuple[str, SlotKey], Rendered] = OrderedDict()

    @property
    def pending(self) -> int:
        """Follow-ups not yet finished (tests wait for none)."""
        return len(self._jobs)

    def call_started(self) -> None:
        """A call for this server arrived: a repair in progress gives way to it."""
        for task in list(self._repairing):
            task.cancel()

    def answered(self, call: AnsweredCall) -> None:
        """Start the follow-up of one answer."""
        job = asyncio.get_running_loop().create_task(self._follow_up(call))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def close(self) -> None:
        for job in list(self._jobs):
            job.cancel()
        if self._jobs:
            await asyncio.gather(*self._jobs, return_exceptions=True)

    async def _follow_up(self, call: AnsweredCall) -> None:
        try:
            found = await self._evidence(call)
        except (GatewayError, ServerRefused, ValueError, KeyError, TypeError) as exc:
            log.info("model %s: cannot read the server's cache state: %s", self._profile, exc)
            return
        if found is None:
            return
        rendered, idle = found
        self._remember(call, rendered)
        if not self._repair or not idle:
            return
        hold = call.slot
        if hold is not None and not hold.take():
            return  # its slot is serving a call, or went to another group
        current = asyncio.current_task()
        assert current is not None
        self._repairing.add(current)
        repaired: int | None = None
        try:
            with call.state.working() if call.state is not None else nullcontext():
                repaired = await self._run_repair(call, rendered)
        finally:
            self._repairing.discard(current)
            if hold is not None:
                hold.release(repaired)

    def _remember(self, call: AnsweredCall, rendered: str) -> None:
        hold = call.slot
        if hold is None or call.server is None or len(rendered) > REWARM_MAX_CHARS:
            return
        key = (call.server, hold.conversation)
        self._recent.pop(key, None)
        self._recent[key] = Rendered(rendered, hold.group, call.task)
        while len(self._recent) > REWARM_CONVERSATIONS:
            self._recent.popitem(last=False)

    def rewarm(self, state: ServerState, root: str, table: SlotTable) -> None:
        """``server`` started again with its cache empty and its slots cannot be restored:
        the conversations it served last (as many as it has slots, the most recent first)
        are evaluated again in their slots while it is idle, each giving way to the first
        call that arrives (metered as repairs)."""
        job = asyncio.get_running_loop().create_task(self._rewarm(state, root, table))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def _rewarm(self, state: ServerState, root: str, table: SlotTable) -> None:
        server = state.name
        recent = [(k[1], r) for k, r in reversed(self._recent.items()) if k[0] == server]
        current = asyncio.current_task()
        assert current is not None
        for conversation, rendered in recent[: len(table)]:
            if state.in_flight > 0:
                return  # a call came: it comes first, and the rest is left
            grant = table.take(rendered.group, conversation)
            if grant is None:
                return
            if grant.resident or grant.erase or grant.leaving is not None:
                # a call put it there already, or the slot holds what must not be lost
                table.release(grant.index)
                continue
            self._repairing.add(current)
            tokens: int | None = None
            try:
                with state.working():
                    tokens = await self._evaluate(
                        rendered.task, server, root, rendered.text, grant.index
                    )
            finally:
                self._repairing.discard(current)
                if tokens is not None:
                    table.filled(grant.index, tokens)
                table.release(grant.index, erased=tokens is not None)

    async def _evaluate(
        self, task: str, server: str, root: str, rendered: str, slot: int
    ) -> int | None:
        """A conversation's rendering evaluated again in ``slot`` after its server
        restarted; the tokens the slot holds then (None: abandoned, or failed)."""
        meter = self._repair_meter(task, server)
        meter.record.adjustments = {"evaluated_after_restart": True}
        body = {"prompt": rendered, "n_predict": 0, "cache_prompt": True, "id_slot": slot}
        answer = await self._evaluated(meter, root, body)
        if answer is None:
            return None
        record = meter.record
        timings = answer.get("timings") or {}
        record.prompt_tokens = count_or_none(answer.get("tokens_evaluated")) or 0
        record.cached_tokens = count_or_none(timings.get("cache_n")) or 0
        record.evaluated_tokens = count_or_none(timings.get("prompt_n")) or 0
        record.completion_tokens = 0
        meter.ok()
        return record.prompt_tokens

    async def _evidence(self, call: AnsweredCall) -> tuple[str, bool] | None:
        """Read the slot before anything else can use it, then compare; returns the next
        request's rendering and whether a slot is idle for the repair."""
        root = call.root
        sent = orjson.loads(call.sent_body)
        if _fetches_media(sent.get("messages")):
            # each rendering would have the server download the URL again (remote_media:
            # pass let it through once, for the call): the answer goes unexamined instead
            call.previous.evidence = AnswerEvidence("unknown")
            return None
        slots = await self._slots(root)
        prompt = await self._render(root, sent)
        following = {
            **sent,
            "messages": next_request_messages(sent["messages"], call.answer),
        }
        following_prompt = await self._render(root, following)
        rendered = cut_at_sentinel(following_prompt) if following_prompt is not None else None
        if prompt is None or rendered is None:
            return None
        previous = call.previous
        slot = pick_slot(slots, prompt)
        idle = isinstance(slots, list) and any(
            isinstance(s, dict) and not s.get("is_processing") for s in slots
        )
        generated = slot.get("generated") if slot is not None else None
        if not isinstance(generated, str):
            previous.evidence = AnswerEvidence("unknown")
            return rendered, idle
        content = call.answer.get("content")
        evidence = text_evidence(
            prompt,
            generated,
            rendered,
            call.answer_had_reasoning,
            call.reasoning_back,
            content if isinstance(content, str) else "",
        )
        if evidence.verdict == "match":
            pieces = await self._pieces(root, rendered)
            evidence = AnswerEvidence("match", token_ends=token_ends_after(pieces, len(prompt)))
        previous.evidence = evidence
        return rendered, idle

    async def _run_repair(self, call: AnsweredCall, rendered: str) -> int | None:
        """Evaluate the next request's rendering in the slot; the tokens it holds then
        (None: the repair failed)."""
        meter = self._repair_meter(call.task, call.server, call.trace)
        record = meter.record
        # the conversation the rendering holds: the request's messages and the answer
        record.messages = call.previous.answer_index + 1
        body: dict[str, Any] = {"prompt": rendered, "n_predict": 0, "cache_prompt": True}
        if call.slot is not None:
            body["id_slot"] = call.slot.index
        answer = await self._evaluated(meter, call.root, body)
        if answer is None:
            return None
        timings = answer.get("timings") or {}
        cache_n = count_or_none(timings.get("cache_n")) or 0
        record.prompt_tokens = count_or_none(answer.get("tokens_evaluated")) or 0
        record.cached_tokens = cache_n
        record.evaluated_tokens = count_or_none(timings.get("prompt_n")) or 0
        record.completion_tokens = 0
        prompt_ms = timings.get("prompt_ms")
        record.prefill_ms = float(prompt_ms) if isinstance(prompt_ms, int | float) else None
        report = repair_report(call.previous, cache_n)
        record.reusable_tokens = report.reusable_tokens
        record.miss_cause = report.cause
        record.miss_at = report.at
        # from now on the cache holds this rendering: the next call is compared with it
        call.previous.repaired_tokens = record.prompt_tokens
        meter.ok()
        return record.prompt_tokens

    def _repair_meter(
        self, task: str, server: str | None, trace: TraceContext | None = None
    ) -> Meter:
        """The record of one of the keeper's evaluations, for ``task``, on ``server``;
        in the trace of the call it follows, where it has one."""
        ctx = CallContext.new(task, REPAIR_PURPOSE, trace=trace.child() if trace else None)
        meter = Meter(self._writer, ctx, self._profile, price=self.price)
        record = meter.record
        record.provider = "local"
        record.server = server
        record.attempts = 1
        return meter

    async def _evaluated(
        self, meter: Meter, root: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """``POST /completion`` of a rendering (``n_predict: 0``); None, its record ended,
        where it failed. A call arriving cancels it: its record says abandoned."""
        try:
            return await self._api.completion(root, body)
        except asyncio.CancelledError:
            meter.abandoned()
            raise
        except GatewayError as exc:
            meter.error(exc)
        except (ServerRefused, MalformedAnswer) as exc:
            meter.error(GatewayError(f"the server did not evaluate the conversation: {exc}"))
        return None

    async def _render(self, root: str, body: dict[str, Any]) -> str | None:
        answer = await self._api.apply_template(root, body)
        prompt = answer.get("prompt")
        return prompt if isinstance(prompt, str) else None

    async def _pieces(self, root: str, text: str) -> list[str]:
        answer = await self._api.tokenize(root, {"content": text, "with_pieces": True})
        out: list[str] = []
        for token in answer.get("tokens") or ():
            piece = token.get("piece") if isinstance(token, dict) else None
            if isinstance(piece, list):  # bytes of a partial UTF-8 sequence
                piece = bytes(piece).decode("utf-8", "ignore")
            out.append(piece if isinstance(piece, str) else "")
        return out

    async def _slots(self, root: str) -> Any:
        """The server's ``/slots`` (None where it has none to show)."""
        try:
            return await self._api.slots(root)
        except ServerRefused:
            return None


def _fetches_media(messages: Any) -> bool:
    """Whether a part of the conversation names its bytes by a URL the server fetches."""
    if not isinstance(messages, list):
        return False
    return any(part.remote_source() is not None for part in media_parts(messages))
