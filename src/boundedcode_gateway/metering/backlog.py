"""What a ledger that went away could not take yet: the records kept, in order, until it
comes back.

Owns the bound (past it the oldest records are dropped, and counted), and when to try
the ledger again: 0.5 s after the first failure, doubling up to 30 s. It must not do
I/O; the meter writer's thread is its only user (the counts are read from others).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from boundedcode_gateway.metering.records import CallRecord

RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0


def retry_delay(failures: int) -> float:
    """Seconds to wait after the ``failures``-th failure in a row (from 1) before trying again."""
    return min(RETRY_FIRST_S * 2.0 ** min(failures - 1, 32), RETRY_MAX_S)


@dataclass(slots=True)
class Pending:
    """One record waiting for the ledger; ``counted`` when the call log holds it, so the
    writer's ``written`` counts it already."""

    record: CallRecord
    counted: bool


class LedgerBacklog:
    """The records waiting for the ledger, oldest first, and the ledger's run of failures."""

    def __init__(self, bound: int) -> None:
        if bound < 1:
            raise ValueError("the ledger buffer must hold at least one record")
        self.bound = bound
        self.dropped = 0  # records given up: the buffer was full, or the writer stopped
        self.failures = 0  # failed tries in a row; 0 while the ledger works
        self._retry_at: float | None = None
        self._pending: deque[Pending] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def failing(self) -> bool:
        """Whether the ledger's last try failed: new records wait behind the kept ones."""
        return self.failures > 0

    def keep(self, pending: Iterable[Pending]) -> list[Pending]:
        """Keep records after those kept; the oldest past the bound are dropped (returned)."""
        self._pending.extend(pending)
        dropped: list[Pending] = []
        while len(self._pending) > self.bound:
            dropped.append(self._pending.popleft())
        self.dropped += len(dropped)
        return dropped

    def head(self, n: int) -> list[Pending]:
        """The oldest ``n`` records kept (fewer when fewer are kept)."""
        return [self._pending[i] for i in range(min(n, len(self._pending)))]

    def release(self, n: int) -> None:
        """The oldest ``n`` records are written: no longer kept."""
        for _ in range(min(n, len(self._pending))):
            self._pending.popleft()

    def give_up(self) -> int:
        """Drop every record kept (the writer is stopping); how many."""
        count = len(self._pending)
        self._pending.clear()
        self.dropped += count
        return count

    def failed(self, now: float) -> None:
        """A try failed at ``now`` (monotonic seconds): the next waits longer."""
        self.failures += 1
        self._retry_at = now + retry_delay(self.failures)

    def succeeded(self) -> None:
        self.failures = 0
        self._retry_at = None

    def wait(self, now: float) -> float | None:
        """Seconds until the next try is due (0 when it is), None while the ledger works."""
        if self._retry_at is None:
            return None
        return max(0.0, self._retry_at - now)

    def due(self, now: float) -> bool:
        return self._retry_at is not None and now >= self._retry_at
