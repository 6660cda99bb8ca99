"""The task state's tables in PostgreSQL (``state:``): their migrations, the operations
the calls count, and what calls go without during an outage. The pool and its outage
handling are ``database/pool.py``'s, shared with the other stores of the same database.
"""

from __future__ import annotations

from boundedcode_gateway.database.migrations import Migration, load_migrations
from boundedcode_gateway.database.pool import PostgresPool, Store
from boundedcode_gateway.database.postgres import MigrationSet
from boundedcode_gateway.locations import PostgresLocation
from boundedcode_gateway.lru import Clock

MIGRATIONS_PACKAGE = "boundedcode_gateway.state"
MIGRATIONS_DIR = "migrations/postgresql"
# recorded apart from the ledger's, under a lock of their own
MIGRATIONS_TABLE = "state_migrations"
# one batch of the retention sweep's deletes
SWEEP_TIMEOUT_S = 120.0
# what each operation is counted as (metric labels)
OPERATIONS = ("read_reasoning", "write_reasoning", "history", "sweep")


def load_state_migrations() -> list[Migration]:
    return load_migrations(MIGRATIONS_DIR, MIGRATIONS_PACKAGE)


TASK_STATE = Store(
    "task state",
    MigrationSet(load_state_migrations, MIGRATIONS_TABLE, "boundedcode_gateway.task_state"),
    OPERATIONS,
    "calls go on without the reasoning and history it holds",
)


MIGRATION_LOCK_KEY = TASK_STATE.migrations.lock_key


def state_database(location: PostgresLocation, clock: Clock | None = None) -> PostgresPool:
    """A pool of ``location`` that serves the task state."""
    pool = PostgresPool(location) if clock is None else PostgresPool(location, clock)
    pool.serve(TASK_STATE)
    return pool
