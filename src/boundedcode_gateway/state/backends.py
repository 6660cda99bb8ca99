"""The one place the task state's backend is chosen, from ``state:``.

The task state is what a gateway's calls read and add to per task: the reasoning store
(every kind of stored reasoning) and the history behind ``changed``. Without ``state:``
they are files under ``data_dir`` and this process's memory, as a gateway that serves
its tasks alone has them; with ``state: postgresql://…``, tables several gateways share
(``database.py``). Each backend opens, sweeps idle tasks and closes in its own way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from boundedcode_gateway.config import GatewayConfig
from boundedcode_gateway.database.pool import PostgresPool
from boundedcode_gateway.locations import PostgresLocation
from boundedcode_gateway.policy.history_diff import History, HistoryTracker
from boundedcode_gateway.providers.registry import REASONING_FILES
from boundedcode_gateway.reasoning_store.backend import ReasoningBackend
from boundedcode_gateway.reasoning_store.store import ReasoningStore
from boundedcode_gateway.state import pg_retention
from boundedcode_gateway.state.database import TASK_STATE
from boundedcode_gateway.state.pg_history import PostgresHistory
from boundedcode_gateway.state.pg_reasoning import PostgresReasoningStore


class TaskState(Protocol):
    """The reasoning store and the history of one backend, and what the gateway's start,
    retention and stop ask of them."""

    @property
    def reasoning(self) -> ReasoningBackend: ...

    @property
    def history(self) -> History: ...

    @property
    def database(self) -> PostgresPool | None:
        """The PostgreSQL database (its health, for the metrics); None for files."""
        ...

    @property
    def where(self) -> str:
        """Where the state lives, for messages (never with a password)."""
        ...

    async def open(self) -> None:
        """Ready to serve, or raise (the start-up's check)."""
        ...

    async def remove_idle_tasks(self, cutoff: float) -> list[str]:
        """Remove the state of the tasks idle since ``cutoff`` (a ``time.time()``); the
        tasks removed."""
        ...

    async def close(self) -> None:
        """Write what is still on its way, then let go."""
        ...


class FileTaskState:
    """Task folders under ``data_dir``, and this process's memory."""

    database: PostgresPool | None = None

    def __init__(self, reasoning: ReasoningStore, history: HistoryTracker) -> None:
        self.reasoning = reasoning
        self.history = history

    @property
    def where(self) -> str:
        return self.reasoning.where

    async def open(self) -> None:
        """Nothing to check: a task's folder is made when it is first written."""

    async def remove_idle_tasks(self, cutoff: float) -> list[str]:
        return await self.reasoning.remove_folders_idle_since(cutoff)

    async def close(self) -> None:
        await self.reasoning.aclose()


class PostgresTaskState:
    """Tables in a PostgreSQL database several gateways share."""

    def __init__(
        self, database: PostgresPool, reasoning: PostgresReasoningStore, history: PostgresHistory
    ) -> None:
        self.database = database
        self.reasoning = reasoning
        self.history = history

    @property
    def where(self) -> str:
        return f"the state database {self.database.location.display}"

    async def open(self) -> None:
        await self.database.open()

    async def remove_idle_tasks(self, cutoff: float) -> list[str]:
        removed = await pg_retention.remove_idle_tasks(self.database, cutoff)
        self.reasoning.forget(removed)
        self.history.forget(removed)
        return removed

    async def close(self) -> None:
        await self.reasoning.aclose()
        await self.database.close()


def task_state_for(
    config: GatewayConfig, database: Callable[[PostgresLocation], PostgresPool] | None = None
) -> FileTaskState | PostgresTaskState:
    """The task state ``config`` names, not yet open; ``database`` gives the pool of a
    database (shared with the other stores kept there), else the state has its own."""
    retention = config.retention
    memory = (retention.tasks_in_memory, retention.task_idle_s)
    location = config.state_location
    if location is None:
        return FileTaskState(
            ReasoningStore(config.data_path, REASONING_FILES, *memory), HistoryTracker(*memory)
        )
    pool = PostgresPool(location) if database is None else database(location)
    pool.serve(TASK_STATE)
    return PostgresTaskState(
        pool, PostgresReasoningStore(pool, *memory), PostgresHistory(pool, *memory)
    )
