"""Task folders removed once idle for ``retention.task_days``: at start, then once a day.

The removal itself runs on the reasoning store's appender thread (never on the event
loop, never between two of its appends); this only schedules it. The call log's
rotation is the meter writer's (``retention.call_log_mib``).
"""

from __future__ import annotations

import asyncio
import logging
import time

from boundedcode_gateway.lru import Clock
from boundedcode_gateway.reasoning_store.store import ReasoningStore

log = logging.getLogger(__name__)

DAY_S = 86400.0


class FolderSweeper:
    """Removes the task folders nothing was written to for ``task_days``, every ``every_s``."""

    def __init__(
        self,
        store: ReasoningStore,
        task_days: float,
        wall_clock: Clock = time.time,
        every_s: float = DAY_S,
    ) -> None:
        self._store = store
        self._max_age_s = task_days * DAY_S
        self._wall_clock = wall_clock
        self._every_s = every_s

    async def sweep(self) -> list[str]:
        """One pass; the tasks whose folders were removed."""
        removed = await self._store.remove_folders_idle_since(self._wall_clock() - self._max_age_s)
        if removed:
            log.info("removed %d idle task folders from %s", len(removed), self._store.tasks_dir)
        return removed

    async def run(self) -> None:
        """Sweep now and then every ``every_s`` until cancelled; a failed pass is logged."""
        while True:
            try:
                await self.sweep()
            except Exception:
                log.exception("removing idle task folders failed")
            await asyncio.sleep(self._every_s)
