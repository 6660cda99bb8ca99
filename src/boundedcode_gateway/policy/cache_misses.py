"""Why a call's prompt did not come from the server's cache: the call log's ``miss_cause``.

Pure: it compares one call with the previous call of the same task, purpose and
profile, and with what the server told about that previous answer afterwards
(``AnswerEvidence``, gathered off the request path by the llama.cpp cache
keeper). A cause that the evidence does not prove is ``server``; nothing here
guesses.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from boundedcode_gateway.json_values import is_int
from boundedcode_gateway.lru import Clock, IdleLru
from boundedcode_gateway.policy.history_diff import MAX_DIGESTS

# Tokens a prompt may miss and still count as served from cache: llama.cpp always
# evaluates the last prompt token again, and the end of the previous answer (its
# end-of-turn token, which the server does not keep) is rendered anew by the template.
MISS_TOLERANCE_TOKENS = 8
# the purpose the gateway's own cache repairs are metered under
REPAIR_PURPOSE = "cache_repair"
# the cause of a prompt served from cache within the tolerance: not a miss
NOT_A_MISS = "none"

MissCause = Literal[
    "first_call",
    "none",
    "history_rewrite",
    "reasoning_dropped",
    "template_render",
    "token_split",
    "server",
    "failover",
    "rebalanced",
    "restore_ineffective",
]
# a conversation's slot file was restored (or refused) and the call found no more cached
RESTORE_INEFFECTIVE: MissCause = "restore_ineffective"
TextVerdict = Literal["match", "template_render", "reasoning_dropped", "unknown"]


@dataclass(frozen=True, slots=True)
class AnswerEvidence:
    """What the server showed of one answer once it was done.

    ``verdict`` compares the text the model generated (the server's slot) with the text
    the next request renders for the same turn: ``match`` when the latter starts with
    the former. ``answer_chars`` is where the answer's turn starts in that rendering;
    ``token_ends`` the end offset (in characters, from ``answer_chars``) of each
    canonical token of the rendering from the previous prompt's last token on, so a
    token position can be named as a character.
    """

    verdict: TextVerdict
    diverged_at: int | None = None  # characters into the answer's turn
    token_ends: tuple[int, ...] = ()

    def char_of_token(self, prompt_tokens: int, position: int) -> int | None:
        """The character (from the answer's start) where the canonical token at ``position``
        begins, ``prompt_tokens`` being the previous prompt's length in tokens."""
        k = position - prompt_tokens
        if k < 0 or k > len(self.token_ends):
            return None
        return 0 if k == 0 else self.token_ends[k - 1]


@dataclass(slots=True)
class PreviousCall:
    """What the next call of a conversation is compared with."""

    prompt_tokens: int
    completion_tokens: int
    answer_index: int  # the answer's index in the next request's messages
    # filled in after the answer by the cache keeper, where the server can tell
    evidence: AnswerEvidence | None = None
    # the tokens of the rendering a repair left in the cache after this answer
    repaired_tokens: int | None = None
    # its request's message digests (``History.compare``): what the conversation's next
    # request changed, where another conversation's request came between the two
    digests: Sequence[int] | None = None

    @property
    def reusable_tokens(self) -> int:
        """What the next call can find cached: the rendering the repair evaluated, else the
        prompt and the generated tokens."""
        if self.repaired_tokens is not None:
            return self.repaired_tokens
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class MissReport:
    reusable_tokens: int | None
    cause: MissCause
    at: dict[str, int] | None = None


def classify(
    previous: PreviousCall | None,
    prompt_tokens: int | None,
    cached_tokens: int | None,
    changed: int | None,
) -> MissReport | None:
    """The miss report of one answered call; None when the server reports no cache."""
    if prompt_tokens is None or cached_tokens is None:
        return None
    if previous is None:
        return MissReport(None, "first_call")
    reusable = min(previous.reusable_tokens, prompt_tokens)
    if reusable - cached_tokens <= MISS_TOLERANCE_TOKENS:
        return MissReport(reusable, "none")
    if changed is not None and changed >= 0:
        return MissReport(reusable, "history_rewrite", {"message": changed})
    return MissReport(reusable, *_answer_cause(previous, cached_tokens))


def _answer_cause(
    previous: PreviousCall, cached_tokens: int
) -> tuple[MissCause, dict[str, int] | None]:
    """The history only grew: the miss is in the previous answer, or the server's doing."""
    evidence = previous.evidence
    # the previous prompt's last tokens may join the answer's first characters when the
    # whole is tokenised anew, so a match ending just short of the answer is in it
    start = previous.prompt_tokens - MISS_TOLERANCE_TOKENS
    in_answer = start <= cached_tokens < previous.prompt_tokens + previous.completion_tokens
    if evidence is None or not in_answer:
        return "server", None
    at = {"message": previous.answer_index}
    if evidence.verdict in ("template_render", "reasoning_dropped"):
        if evidence.diverged_at is not None:
            at["char"] = evidence.diverged_at
        return evidence.verdict, at
    if evidence.verdict == "match":
        char = evidence.char_of_token(previous.prompt_tokens, cached_tokens)
        if char is not None:
            at["char"] = char
        return "token_split", at
    return "server", None


def common_prefix_length(a: str, b: str) -> int:
    """Characters ``a`` and ``b`` share from the start."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def token_ends_after(pieces: list[str], start_chars: int) -> tuple[int, ...]:
    """End offsets, relative to ``start_chars``, of the tokens that end after it."""
    ends: list[int] = []
    total = 0
    for piece in pieces:
        total += len(piece)
        ends.append(total)
    first = bisect_left(ends, start_chars + 1)
    return tuple(e - start_chars for e in ends[first:])


# (task, purpose, profile, a digest of the requests' first message): one conversation
ConversationId = tuple[str, str, str, str]


class ContinuityTable:
    """The previous call per conversation (task, purpose, profile and first message: a
    client's side requests, a title or a summary, are conversations of their own), in
    memory: at most ``max_keys`` of them, none idle for longer than ``idle_s``; the least
    recently used goes first, and the next call of a conversation forgotten is a
    ``first_call``."""

    def __init__(
        self, max_keys: int = 4096, idle_s: float | None = None, clock: Clock = time.monotonic
    ) -> None:
        # weighed by the digests each call holds, within what the request history holds
        self._last: IdleLru[ConversationId, PreviousCall] = IdleLru(
            max_keys, idle_s, clock, max_weight=MAX_DIGESTS
        )
        # per task, purpose and profile: the conversation of its last call
        self._latest: IdleLru[tuple[str, str, str], str] = IdleLru(max_keys, idle_s, clock)

    def __len__(self) -> int:
        return len(self._last)

    @classmethod
    def from_call_log(
        cls,
        records: Iterable[Mapping[str, Any]],
        max_keys: int = 4096,
        idle_s: float | None = None,
        clock: Clock = time.monotonic,
    ) -> ContinuityTable:
        """The table as the calls of a call log (oldest first) left it, so that a restarted
        gateway goes on comparing each conversation with its previous call.

        Only calls whose miss was worked out (a server that reports its cache) count; a
        cache repair counts for the last such call of its task and profile, as it ran
        right after that answer. The slot's evidence is not logged, so a miss inside the
        answer before the restart is named ``server``.
        """
        table = cls(max_keys, idle_s, clock)
        last_of: dict[tuple[str, str], ConversationId] = {}
        for r in records:
            task, purpose, profile = r.get("task"), r.get("purpose"), r.get("model_profile")
            if not all(isinstance(v, str) for v in (task, purpose, profile)):
                continue
            assert isinstance(task, str) and isinstance(purpose, str) and isinstance(profile, str)
            prompt, completion = r.get("prompt_tokens"), r.get("completion_tokens")
            if r.get("status") != "ok" or not is_int(prompt):
                continue
            if purpose == REPAIR_PURPOSE:
                key = last_of.get((task, profile))
                known = table.previous(key) if key else None
                if known is not None:
                    known.repaired_tokens = prompt
                continue
            if r.get("miss_cause") is None or not is_int(completion):
                continue
            head = r.get("conversation")
            key = (task, purpose, profile, head if isinstance(head, str) else "")
            table.remember(key, PreviousCall(prompt, completion, int(r.get("messages") or 0)))
            last_of[(task, profile)] = key
        return table

    def previous(self, key: ConversationId) -> PreviousCall | None:
        return self._last.get(key)

    def compared(self, key: ConversationId) -> tuple[PreviousCall | None, bool]:
        """What the next call of conversation ``key`` is compared with: its own previous
        call; for its first, the last call of its task, purpose and profile (a history
        rewritten from its first message is a conversation of its own, and the rewrite is
        named). And whether the request history ``changed`` compares with, kept per task
        and purpose, was that call's: not after another conversation's call (a side
        request between two turns; compare with the call's own ``digests`` then)."""
        own = self._last.get(key)
        latest = self._latest.peek(key[:3])
        if own is not None:
            return own, latest == key[3]
        if latest is None:
            return None, True
        return self._last.get((*key[:3], latest)), True

    def remember(self, key: ConversationId, call: PreviousCall) -> None:
        self._last.put(key, call, len(call.digests or ()))
        self._latest.put(key[:3], key[3])
