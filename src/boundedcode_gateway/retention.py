"""Idle tasks' state removed once idle for ``retention.task_days``: at start, then once a day.

The removal is the task state's own (``state/backends.py``): task folders, removed on the
reasoning store's appender thread (never on the event loop, never between two of its
appends), or a state database's rows; this only schedules it. The call log's rotation is
the meter writer's (``retention.call_log_mib``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from boundedcode_gateway.lru import Clock

log = logging.getLogger(__name__)

DAY_S = 86400.0


class IdleTasks(Protocol):
    """Where the tasks' state lives, and its removal of the idle ones."""

    @property
    def where(self) -> str: ...

    async def remove_idle_tasks(self, cutoff: float) -> list[str]: ...


class IdleTaskSweeper:
    """Removes the state of the tasks nothing was written to for ``task_days``, every
    ``every_s``."""

    def __init__(
        self,
        state: IdleTasks,
        task_days: float,
        wall_clock: Clock = time.time,
        every_s: float = DAY_S,
    ) -> None:
        self._state = state
        self._max_age_s = task_days * DAY_S
        self._wall_clock = wall_clock
        self._every_s = every_s

    async def sweep(self) -> list[str]:
        """One pass; the tasks whose state was removed."""
        removed = await self._state.remove_idle_tasks(self._wall_clock() - self._max_age_s)
        if removed:
            log.info("removed %d idle tasks from %s", len(removed), self._state.where)
        return removed

    async def run(self) -> None:
        """Sweep now and then every ``every_s`` until cancelled; a failed pass is logged."""
        while True:
            try:
                await self.sweep()
            except Exception:
                log.exception("removing idle tasks from %s failed", self._state.where)
            await asyncio.sleep(self._every_s)
