"""One server of a pool as the gateway last saw it: up or not, how busy, how fast.

The caller keeps it current (a call sent and ended, a ``/slots`` reading, a health
probe, a restart, each answer's timings); ``routing.py`` only reads it. No I/O: each
change is a method call with what was observed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from boundedcode_gateway.pools.holdings import (
    DEFAULT_MAX_CONVERSATIONS,
    CacheHoldings,
    ConversationKey,
)

# llama-server's slots when ``--parallel`` is left to it
DEFAULT_PARALLEL = 4
# Before a pool has measured anything: a prompt's evaluation speed and how long a call
# holds its slot. Rough on purpose; each answer's timings replace them.
DEFAULT_PREFILL_TPS = 500.0
DEFAULT_SLOT_S = 20.0
# weight of the newest measurement in a moving average
SMOOTHING = 0.25
# fewer evaluated tokens than this say more about a call's fixed costs than the speed
MIN_PREFILL_SAMPLE_TOKENS = 64


class MovingAverage:
    """An exponentially weighted mean; None until the first value."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: float | None = None

    def add(self, sample: float) -> None:
        if self.value is None:
            self.value = sample
        else:
            self.value += SMOOTHING * (sample - self.value)


class ServerState:
    """A server of a pool: its health, its load and its measured speed, and what its
    cache is expected to hold."""

    __slots__ = (
        "_prefill_tps",
        "_slot_s",
        "background",
        "busy_slots",
        "healthy",
        "holdings",
        "in_flight",
        "name",
        "others_busy",
        "parallel",
    )

    def __init__(
        self,
        name: str,
        parallel: int = DEFAULT_PARALLEL,
        *,
        healthy: bool = True,
        max_conversations: int = DEFAULT_MAX_CONVERSATIONS,
        max_tokens: int | None = None,
    ) -> None:
        if parallel < 1:
            raise ValueError(f"a server has one slot or more, not {parallel}")
        self.name = name  # for logs and records: its URL, or the profile and replica
        self.parallel = parallel
        self.healthy = healthy
        self.in_flight = 0  # the gateway's calls sent to it and not ended
        # the gateway's own work there that gives way to any call (cache repairs)
        self.background = 0
        # slots processing at its last ``GET /slots``, everyone's
        self.busy_slots: int | None = None
        # of those, the ones not the gateway's calls or background work when read
        self.others_busy = 0
        self.holdings = CacheHoldings(max_conversations, max_tokens)
        self._prefill_tps = MovingAverage()
        self._slot_s = MovingAverage()

    def __repr__(self) -> str:
        return (
            f"ServerState({self.name!r}, healthy={self.healthy}, load={self.load}"
            f"/{self.parallel}, holds={len(self.holdings)})"
        )

    @property
    def load(self) -> int:
        """Slots taken, as far as the gateway knows: its own calls now, and those of
        other clients at the last ``/slots`` reading. The gateway's background work is
        left out (it gives way to the next call), and so is a reading's count of the
        gateway's calls that have ended since: a reading up to a second old would
        otherwise keep a lone conversation's idle server busy and move it away."""
        return self.in_flight + self.others_busy

    @property
    def busy(self) -> bool:
        """Every slot taken: a call sent now waits for one to free."""
        return self.load >= self.parallel

    @property
    def prefill_tps(self) -> float | None:
        """Measured prompt evaluation speed, tokens per second (None: not measured yet)."""
        return self._prefill_tps.value

    @property
    def slot_s(self) -> float | None:
        """Measured seconds a call holds its slot (None: not measured yet)."""
        return self._slot_s.value

    def call_started(self) -> None:
        self.in_flight += 1

    def call_ended(self) -> None:
        self.in_flight = max(self.in_flight - 1, 0)

    @contextmanager
    def working(self) -> Iterator[None]:
        """The gateway's own background work on the server, while it runs."""
        self.background += 1
        try:
            yield
        finally:
            self.background -= 1

    def slots_read(self, busy: int | None, total: int | None = None) -> None:
        """``GET /slots`` showed ``busy`` slots processing (None: it could not be read) of
        ``total`` (a server the gateway does not run tells its ``parallel`` so)."""
        self.busy_slots = None if busy is None else max(busy, 0)
        self.others_busy = max((self.busy_slots or 0) - self.in_flight - self.background, 0)
        if total is not None and total >= 1:
            self.parallel = total

    def answered(
        self,
        key: ConversationKey,
        cached: int,
        evaluated: int,
        generated: int,
        prompt_ms: float | None = None,
        slot_ms: float | None = None,
    ) -> None:
        """An answer ended, with llama.cpp's ``timings``: ``cache_n`` (``cached``),
        ``prompt_n`` (``evaluated``), ``predicted_n`` (``generated``), ``prompt_ms``;
        ``slot_ms`` the time the call held its slot (``prompt_ms + predicted_ms``)."""
        self.holdings.answered(key, cached, evaluated, generated)
        self.measured(evaluated, prompt_ms, slot_ms)

    def measured(
        self, evaluated: int, prompt_ms: float | None, slot_ms: float | None = None
    ) -> None:
        """A call's timings: ``evaluated`` prompt tokens in ``prompt_ms``, its slot held for
        ``slot_ms``. Each moves the server's moving averages (a prompt too short to tell
        the speed leaves it)."""
        if prompt_ms is not None and prompt_ms > 0 and evaluated >= MIN_PREFILL_SAMPLE_TOKENS:
            self._prefill_tps.add(evaluated * 1000.0 / prompt_ms)
        if slot_ms is not None and slot_ms > 0:
            self._slot_s.add(slot_ms / 1000.0)

    def reused(self, key: ConversationKey, cached: int) -> int:
        """A call found ``cached`` tokens of the conversation cached (see
        ``CacheHoldings.reused``); the tokens the estimate lost."""
        return self.holdings.reused(key, cached)

    def restarted(self) -> None:
        """The server started again: its cache and its slots are empty. Its speed stays
        (the same model on the same hardware)."""
        self.holdings.forget()
        self.busy_slots = None
        self.others_busy = 0
