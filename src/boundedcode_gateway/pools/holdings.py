"""What one server is expected to hold in its prompt cache, per conversation.

llama.cpp keeps a conversation's tokens after its answer (in a slot, or in the
host-memory cache with ``--cache-ram``), and the next call of the conversation that
finds them evaluates only what is new. The estimate for a conversation is what its
last answer left there: the prompt (cached and evaluated) and the generated tokens.
A later answer that found less cached than that shows the server let part of it go
(another conversation took the slot, the cache ran out of room): the estimate
becomes what was found. The table forgets the least recently answered
conversations first, as a server's cache does.
"""

from __future__ import annotations

from boundedcode_gateway.lru import IdleLru

# (task, purpose): a conversation with one profile, as the cache-miss report keys it
ConversationKey = tuple[str, str]

# conversations a server is expected to hold at most, unless told otherwise
DEFAULT_MAX_CONVERSATIONS = 1024


def _no_clock() -> float:
    # nothing is forgotten for being idle: recency is the order of the answers alone
    return 0.0


class CacheHoldings:
    """Tokens expected in one server's cache per conversation: at most ``max_conversations``
    of them and (if set) ``max_tokens`` in all, the least recently answered forgotten first."""

    __slots__ = ("_held", "_max_conversations", "_max_tokens")

    def __init__(
        self, max_conversations: int = DEFAULT_MAX_CONVERSATIONS, max_tokens: int | None = None
    ) -> None:
        self._max_conversations = max_conversations
        self._max_tokens = max_tokens
        self._held = self._empty()

    def _empty(self) -> IdleLru[ConversationKey, int]:
        return IdleLru(self._max_conversations, None, _no_clock, self._max_tokens)

    def __len__(self) -> int:
        return len(self._held)

    @property
    def total_tokens(self) -> int:
        """The tokens of every conversation the server is expected to hold."""
        return self._held.weight

    def expected(self, key: ConversationKey) -> int:
        """Tokens of the conversation the server is expected to hold (0: none); reading
        it does not make the conversation more recent."""
        return self._held.peek(key) or 0

    def answered(self, key: ConversationKey, cached: int, evaluated: int, generated: int) -> None:
        """An answer of the conversation ended: the server holds its whole prompt (``cached``
        found, ``evaluated`` new) and what it generated."""
        tokens = max(cached, 0) + max(evaluated, 0) + max(generated, 0)
        self._held.put(key, tokens, tokens)

    def reused(self, key: ConversationKey, cached: int) -> int:
        """A call of the conversation found ``cached`` tokens in the server's cache (its
        prompt progress, or an answer that broke off): an estimate above that comes down
        to it. The tokens the estimate lost (0 when it held)."""
        expected = self._held.peek(key)
        cached = max(cached, 0)
        if expected is None or cached >= expected:
            return 0
        if cached:
            self._held.put(key, cached, cached)
        else:
            self._held.pop(key)
        return expected - cached

    def forget(self) -> None:
        """The server restarted: its cache is empty."""
        self._held = self._empty()
