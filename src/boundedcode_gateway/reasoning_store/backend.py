"""What a reasoning store is to the calls, whichever backend keeps it.

Two backends implement it: files under ``data_dir`` with the loaded tasks in memory
(``store.py``), and a PostgreSQL database several gateways share
(``state/pg_reasoning.py``); ``state/backends.py`` chooses one. The adapters see only
``CallReasoning``; the call flow only ``ReasoningBackend``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from boundedcode_gateway.call_context import TASK_SCOPE
from boundedcode_gateway.reasoning_store.store import ReasoningItem


class CallReasoning(Protocol):
    """One task's reasoning as one call sees it, of the call's scope only (what callers of
    another scope kept is not found, nor replaced): looked up while the request is
    prepared, added to once the answer is in."""

    def find(self, kind: str, keys: Sequence[str]) -> ReasoningItem | None:
        """The item stored under any of the keys."""
        ...

    def keep(self, kind: str, keys: Sequence[str], provider: str, profile: str, data: Any) -> None:
        """Store one turn's reasoning once, found under each of its keys (never raises, never
        waits)."""
        ...

    async def saved(self) -> None:
        """Once what this call kept is where the next call finds it, whichever gateway serves
        that call (at once where only this process can serve it). Never raises."""
        ...


class ReasoningBackend(Protocol):
    """Every task's reasoning."""

    @property
    def tasks_in_memory(self) -> int:
        """The tasks whose items this process holds in memory."""
        ...

    async def task(self, task: str, scope: str = TASK_SCOPE) -> CallReasoning:
        """The task's reasoning for one call of ``scope`` (``call_context.py``), with what
        calls of that scope that already answered kept."""
        ...
