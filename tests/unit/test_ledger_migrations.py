"""Both ledgers' migrations, read as text: the same numbers and names, and the columns they
make are the record's ledger fields, in order, each of a type that fits its Python type."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest

from boundedcode_gateway.database.migrations import Migration
from boundedcode_gateway.metering.ledger import load_ledger_migrations
from boundedcode_gateway.metering.pg_ledger import load_pg_migrations
from boundedcode_gateway.metering.records import LEDGER_FIELDS, CallRecord

_CREATE = re.compile(r"CREATE TABLE model_calls \((?P<body>.*?)\n\);", re.S)
_TYPE = r"(?P<type>[A-Z]+(?: PRECISION)?)"
_ADD = re.compile(rf"ALTER TABLE model_calls ADD COLUMN (?P<column>\w+) {_TYPE}")
_COLUMN = re.compile(rf"^\s*(?P<column>\w+) {_TYPE}")
_INDEX = re.compile(r"CREATE INDEX (?P<name>\w+) ON model_calls \((?P<columns>[\w, ]+)\)")
# the column PostgreSQL adds for insertion order (SQLite's own rowid)
PG_ONLY = {"seq"}

SQLITE_TYPES = {"str": "TEXT", "int": "INTEGER", "float": "DOUBLE PRECISION", "bool": "BOOLEAN"}
PG_TYPES = {"str": "TEXT", "int": "BIGINT", "float": "DOUBLE PRECISION", "bool": "BOOLEAN"}


def columns(migrations: list[Migration]) -> list[tuple[str, str]]:
    """The table's columns after every migration, in order, with their declared types."""
    found: list[tuple[str, str]] = []
    for migration in migrations:
        create = _CREATE.search(migration.sql)
        if create is not None:
            for line in create.group("body").splitlines():
                match = _COLUMN.match(line)
                if match is not None:
                    found.append((match.group("column"), match.group("type")))
        found += [(m.group("column"), m.group("type")) for m in _ADD.finditer(migration.sql)]
    return found


def indexes(migrations: list[Migration]) -> dict[str, str]:
    return {
        m.group("name"): m.group("columns")
        for migration in migrations
        for m in _INDEX.finditer(migration.sql)
    }


def test_both_ledgers_have_the_same_migrations() -> None:
    sqlite, pg = load_ledger_migrations(), load_pg_migrations()
    assert [(m.version, m.name) for m in pg] == [(m.version, m.name) for m in sqlite]
    assert [m.version for m in sqlite] == list(range(1, len(sqlite) + 1))
    assert indexes(pg) == indexes(sqlite) != {}


@pytest.mark.parametrize(
    ("migrations", "types", "extra"),
    [(load_ledger_migrations(), SQLITE_TYPES, set()), (load_pg_migrations(), PG_TYPES, PG_ONLY)],
    ids=["sqlite", "postgresql"],
)
def test_the_columns_are_the_ledger_fields(
    migrations: list[Migration], types: dict[str, str], extra: set[str]
) -> None:
    found = columns(migrations)
    assert [name for name, _ in found if name not in extra] == list(LEDGER_FIELDS)
    python_type = {f.name: str(f.type).removesuffix(" | None") for f in fields(CallRecord)}
    for name, declared in found:
        if name not in extra:
            assert declared == types[python_type[name]], name
