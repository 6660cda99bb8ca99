"""The task state in PostgreSQL (``state:``), two gateways on one database: each kind of
reasoning read back byte for byte by the other gateway, a task's items never skipped by a
reader however its writers interleave, the history's ``changed`` the same as one
gateway's, retention's removals seen by the other gateway, the migrations apart from the
ledger's. Each "gateway" here is a ``PostgresPool`` of its own, with a pool of its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from itertools import count
from typing import Any

import asyncpg
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boundedcode_gateway.call_context import TASK_SCOPE
from boundedcode_gateway.database.postgres import apply_migrations
from boundedcode_gateway.locations import PostgresLocation
from boundedcode_gateway.metering.pg_ledger import load_pg_migrations, migrate
from boundedcode_gateway.policy.history_diff import GREW_ONLY, HistoryTracker, unpack_digests
from boundedcode_gateway.providers.registry import REASONING_FILES
from boundedcode_gateway.state import pg_retention
from boundedcode_gateway.state.backends import PostgresTaskState
from boundedcode_gateway.state.database import (
    MIGRATION_LOCK_KEY,
    MIGRATIONS_TABLE,
    load_state_migrations,
    state_database,
)
from boundedcode_gateway.state.pg_history import PostgresHistory
from boundedcode_gateway.state.pg_reasoning import PostgresReasoningStore
from tests.postgres_db import PgDatabase, run_async

DAY = timedelta(days=1)

# what each kind's adapter keeps, as it may look: text with what JSON must escape, blocks
# whose key order counts for their signature, an opaque signature
KINDS: dict[str, Any] = {
    "reasoning_content": "The bug is in parse.\n\tLine 12 — “quoted”, a NUL \x00 and 🙂  ",
    "anthropic_thinking": [
        {"type": "thinking", "thinking": "Read the file first.", "signature": "EqQBCkgIARAB"},
        {"type": "redacted_thinking", "data": "RWRhY3RlZA=="},
    ],
    "gemini_signature": {"signature": "CiQBVKhc7n3R4/+opaque==", "part": 1},
}


class Gateway:
    """What one gateway holds of the task state: its pool, its store, its history."""

    def __init__(self, url: str) -> None:
        self.db = state_database(PostgresLocation(url))
        self.reasoning = PostgresReasoningStore(self.db)
        self.history = PostgresHistory(self.db)
        self.state = PostgresTaskState(self.db, self.reasoning, self.history)

    async def keep(self, task: str, kind: str, keys: list[str], data: Any) -> None:
        """One call that keeps one turn's reasoning, until its answer would end."""
        call = await self.reasoning.task(task)
        call.keep(kind, keys, "local", "qwen", data)
        await call.saved()

    async def find(self, task: str, kind: str, key: str) -> Any:
        found = (await self.reasoning.task(task)).find(kind, [key])
        return None if found is None else found.data


async def opened(*urls: str) -> list[Gateway]:
    gateways = [Gateway(url) for url in urls]
    await asyncio.gather(*(g.state.open() for g in gateways))
    return gateways


async def closed(gateways: list[Gateway]) -> None:
    for gateway in gateways:
        await gateway.state.close()


@pytest.fixture
async def two(pg: PgDatabase) -> AsyncIterator[tuple[Gateway, Gateway]]:
    a, b = await opened(pg.url, pg.url)
    yield a, b
    await closed([a, b])


def test_every_kind_the_adapters_keep_is_covered() -> None:
    assert set(KINDS) == set(REASONING_FILES)


async def test_each_kind_goes_to_the_other_gateway_byte_for_byte(
    two: tuple[Gateway, Gateway],
) -> None:
    a, b = two
    for kind, data in KINDS.items():
        await a.keep("t", kind, ["tool:call_1", "tool:call_2"], data)
    call = await b.reasoning.task("t")
    for kind, data in KINDS.items():
        for key in ("tool:call_1", "tool:call_2"):
            item = call.find(kind, [key])
            assert item is not None
            assert (item.kind, item.keys, item.provider, item.profile) == (
                kind,
                ("tool:call_1", "tool:call_2"),
                "local",
                "qwen",
            )
            assert orjson.dumps(item.data) == orjson.dumps(data)  # key order included
    assert call.find("reasoning_content", ["tool:other"]) is None


async def test_each_call_reads_what_calls_through_the_other_gateway_kept(
    two: tuple[Gateway, Gateway], pg: PgDatabase
) -> None:
    a, b = two
    for turn in range(6):
        writer, reader = (a, b) if turn % 2 == 0 else (b, a)
        await writer.keep("t", "reasoning_content", [f"text:{turn}"], f"thought {turn}")
        for earlier in range(turn + 1):
            assert await reader.find("t", "reasoning_content", f"text:{earlier}") == (
                f"thought {earlier}"
            )
    # a key kept again: the newer reasoning wins everywhere
    await b.keep("t", "reasoning_content", ["text:0"], "thought 0, again")
    assert await a.find("t", "reasoning_content", "text:0") == "thought 0, again"
    rows = pg.fetch("SELECT keys, seq FROM state_reasoning WHERE task = 't' ORDER BY seq")
    assert [r["keys"] for r in rows] == [[f"text:{i}"] for i in range(1, 6)] + [["text:0"]]
    assert [r["seq"] for r in rows] == [2, 3, 4, 5, 6, 7]


async def test_a_reader_never_skips_an_item_however_the_writers_interleave(
    pg: PgDatabase,
) -> None:
    """Writers of one task on three gateways at once, and a reader on a fourth reading
    all the while: items numbered above what it read become visible only in order, so
    reading what is above the highest number it holds finds every one of them."""
    gateways = await opened(*[pg.url] * 4)
    writers, reader = gateways[:3], gateways[3]
    done = False

    async def keep_many(n: int, gateway: Gateway) -> None:
        for i in range(25):
            await gateway.keep("busy", "reasoning_content", [f"text:{n}:{i}"], f"{n}:{i}")

    async def read_all_the_while() -> int:
        reads = 0
        while not done:
            await reader.reasoning.task("busy")
            reads += 1
        return reads

    try:
        reading = asyncio.ensure_future(read_all_the_while())
        await asyncio.gather(*(keep_many(n, g) for n, g in enumerate(writers)))
        done = True
        assert await reading > 5
        call = await reader.reasoning.task("busy")
        for n in range(3):
            for i in range(25):
                item = call.find("reasoning_content", [f"text:{n}:{i}"])
                assert item is not None and item.data == f"{n}:{i}"
    finally:
        await closed(gateways)
    seqs = [r["seq"] for r in pg.fetch("SELECT seq FROM state_reasoning ORDER BY seq")]
    assert seqs == list(range(1, 76))


async def test_a_failed_write_leaves_the_item_with_its_own_gateway(
    two: tuple[Gateway, Gateway], pg: PgDatabase
) -> None:
    a, b = two
    # PostgreSQL text cannot hold a NUL: the row is refused, the call goes on
    await a.keep("t", "reasoning_content", ["tool:bad\x00id"], "kept here")
    assert await a.find("t", "reasoning_content", "tool:bad\x00id") == "kept here"
    assert await b.find("t", "reasoning_content", "tool:bad\x00id") is None
    assert a.db.unavailable["write_reasoning"] == 1
    assert a.db.up  # the values' fault, not the database's
    assert pg.fetch("SELECT count(*) AS n FROM state_reasoning") == [{"n": 0}]


async def test_a_row_that_is_not_json_is_skipped(
    two: tuple[Gateway, Gateway], pg: PgDatabase
) -> None:
    a, b = two
    await a.keep("t", "reasoning_content", ["text:1"], "one")
    pg.execute("UPDATE state_reasoning SET data = 'not json'::bytea")
    await a.keep("t", "reasoning_content", ["text:2"], "two")
    call = await b.reasoning.task("t")
    assert call.find("reasoning_content", ["text:1"]) is None
    found = call.find("reasoning_content", ["text:2"])
    assert found is not None and found.data == "two"


HISTORIES: list[list[str]] = [
    ["s", "u1"],
    ["s", "u1", "a1", "u2"],  # grew
    ["s", "u1", "a1", "u2", "a2", "u3"],  # grew
    ["s", "CONDENSED", "a2", "u3"],  # rewritten at 1, and shorter
    ["s", "CONDENSED", "a2", "u3"],  # the same again
    ["s", "CONDENSED"],  # cut short
    ["s", "CONDENSED", "a3", "u4", "a4", "u5"],  # grew
]


def as_messages(texts: list[str]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": t} for t in texts]


async def test_changed_through_two_gateways_in_turn_is_one_gateways(
    two: tuple[Gateway, Gateway],
) -> None:
    a, b = two
    one = HistoryTracker()
    expected = [one.observe("t", "agent_turn", as_messages(h)) for h in HISTORIES]
    assert expected == [GREW_ONLY, GREW_ONLY, GREW_ONLY, 1, GREW_ONLY, 2, GREW_ONLY]
    found = [
        await (a, b)[i % 2].history.changed("t", "agent_turn", as_messages(h))
        for i, h in enumerate(HISTORIES)
    ]
    assert found == expected
    # another purpose of the task has a history of its own
    assert await b.history.changed("t", "condenser", as_messages(["x"])) == GREW_ONLY
    assert await a.history.changed("t", "condenser", as_messages(["y"])) == 0


async def test_a_gateway_that_served_the_previous_call_is_not_sent_its_digests(
    two: tuple[Gateway, Gateway], pg: PgDatabase
) -> None:
    a, b = two
    await a.history.changed("t", "agent_turn", as_messages(["s", "u1"]))
    # a second gateway does not hold the previous call: its digests come from the row
    assert await b.history.changed("t", "agent_turn", as_messages(["X", "u1", "a1"])) == 0
    # the row now holds b's digests; b holds the same version, a an older one
    [row] = pg.fetch("SELECT version, digests FROM state_history")
    assert len(unpack_digests(row["digests"])) == 3
    held = b.history._held.peek(("t", "agent_turn"))
    assert held is not None and held.version == row["version"]
    assert await b.history.changed("t", "agent_turn", as_messages(["X", "u1", "a1", "u2"])) == (
        GREW_ONLY
    )
    assert await a.history.changed("t", "agent_turn", as_messages(["X", "u1", "b"])) == 2


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    requests=st.lists(
        st.tuples(
            st.sampled_from(["agent_turn", "condenser"]),
            st.lists(st.sampled_from(["a", "b", "c"]), max_size=5),
            st.integers(0, 1),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_any_requests_through_either_gateway_give_one_gateways_changed(
    pg: PgDatabase, requests: list[tuple[str, list[str], int]]
) -> None:
    task = f"t{next(TASK_NUMBERS)}"  # the database is the test's, the task the example's
    one = HistoryTracker()
    expected = [one.observe(task, p, as_messages(h)) for p, h, _ in requests]

    async def through_both() -> list[int | None]:
        gateways = await opened(pg.url, pg.url)
        try:
            return [
                await gateways[g].history.changed(task, p, as_messages(h)) for p, h, g in requests
            ]
        finally:
            await closed(gateways)

    assert run_async(through_both) == expected


TASK_NUMBERS = count()


async def test_concurrent_requests_of_one_conversation_each_find_one_before_it(
    two: tuple[Gateway, Gateway], pg: PgDatabase
) -> None:
    a, b = two
    histories = [as_messages(["s", *[f"m{j}" for j in range(i)]]) for i in range(12)]
    results = await asyncio.gather(
        *((a, b)[i % 2].history.changed("t", "agent_turn", h) for i, h in enumerate(histories))
    )
    # each was compared with the one before it, whichever that was: a shorter history
    # (grew only) or a longer one (cut short where this one ends)
    for i, changed in enumerate(results):
        assert changed in (GREW_ONLY, len(histories[i])), results
    [row] = pg.fetch("SELECT digests FROM state_history")
    assert len(unpack_digests(row["digests"])) in range(1, 13)


async def test_retention_removes_idle_tasks_and_the_other_gateway_lets_go(
    two: tuple[Gateway, Gateway], pg: PgDatabase
) -> None:
    a, b = two
    for task in ("old", "young"):
        await a.keep(task, "reasoning_content", ["text:1"], f"{task} thought")
        await a.history.changed(task, "agent_turn", as_messages(["s"]))
    pg.execute("UPDATE state_tasks SET written_at = now() - interval '40 days' WHERE task = 'old'")
    pg.execute(
        "UPDATE state_history SET updated_at = now() - interval '40 days' WHERE task = 'old'"
    )
    assert await b.find("old", "reasoning_content", "text:1") == "old thought"  # b holds it
    cutoff = (datetime.now(UTC) - 30 * DAY).timestamp()
    assert await a.state.remove_idle_tasks(cutoff) == ["old"]
    assert pg.fetch("SELECT DISTINCT task FROM state_reasoning") == [{"task": "young"}]
    assert pg.fetch("SELECT task FROM state_history") == [{"task": "young"}]
    # b finds the task gone on its next call, and a task written again from the start
    assert await b.find("old", "reasoning_content", "text:1") is None
    await a.keep("old", "reasoning_content", ["text:2"], "a new start")
    call = await b.reasoning.task("old")
    assert call.find("reasoning_content", ["text:1"]) is None
    found = call.find("reasoning_content", ["text:2"])
    assert found is not None and found.data == "a new start"
    assert await b.find("young", "reasoning_content", "text:1") == "young thought"
    # a history removed starts again as a first call, whichever gateway held it
    assert await a.history.changed("old", "agent_turn", as_messages(["other"])) == GREW_ONLY
    assert await a.state.remove_idle_tasks(cutoff) == []


async def test_retention_deletes_in_batches(
    two: tuple[Gateway, Gateway], pg: PgDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_retention, "BATCH_ROWS", 2)
    a, _ = two
    for i in range(5):
        await a.keep(f"t{i}", "reasoning_content", ["text:1"], "x")
        await a.history.changed(f"t{i}", "agent_turn", as_messages(["s"]))
    removed = await a.state.remove_idle_tasks(time.time() + 60)
    assert sorted(removed) == [f"t{i}" for i in range(5)]
    for table in ("state_tasks", "state_reasoning", "state_history"):
        assert pg.fetch(f"SELECT count(*) AS n FROM {table}") == [{"n": 0}]


async def test_the_migrations_are_the_state_tables_own(pg: PgDatabase) -> None:
    # three gateways starting at once on an empty database apply each migration once
    gateways = await opened(pg.url, pg.url, pg.url)
    await closed(gateways)
    applied = pg.fetch(f"SELECT version, name FROM {MIGRATIONS_TABLE} ORDER BY version")
    assert [(r["version"], r["name"]) for r in applied] == [
        (m.version, m.name) for m in load_state_migrations()
    ]
    assert pg.fetch("SELECT to_regclass('schema_migrations') AS t") == [{"t": None}]

    # the ledger in the same database keeps its own record, and the state tables theirs
    async def migrate_ledger() -> None:
        conn = await asyncpg.connect(pg.url)
        try:
            await migrate(conn)
        finally:
            await conn.close()

    run_async(migrate_ledger)
    versions = pg.fetch("SELECT version FROM schema_migrations ORDER BY version")
    assert [v["version"] for v in versions] == [m.version for m in load_pg_migrations()]
    again = await opened(pg.url)
    await closed(again)
    assert len(pg.fetch(f"SELECT version FROM {MIGRATIONS_TABLE}")) == len(load_state_migrations())


WIDE_KEYS = [f"tool:call_{i}" for i in range(400)]
WIDE_TEXT = "".join(f"thought {i}; " for i in range(40_000))  # about 470 KB


async def test_an_answer_with_many_keys_is_one_row(
    two: tuple[Gateway, Gateway], pg: PgDatabase
) -> None:
    a, b = two
    await a.keep("t", "reasoning_content", WIDE_KEYS, WIDE_TEXT)
    [row] = pg.fetch("SELECT keys, seq, octet_length(data) AS n FROM state_reasoning")
    assert row["keys"] == WIDE_KEYS and row["seq"] == 1
    assert row["n"] < 2 * len(WIDE_TEXT)
    held = a.reasoning._held.peek("t")
    assert held is not None and held.size < 2 * len(WIDE_TEXT)
    call = await b.reasoning.task("t")
    first = call.find("reasoning_content", [WIDE_KEYS[0]])
    assert first is not None and first.data == WIDE_TEXT
    assert all(call.find("reasoning_content", [k]) is first for k in WIDE_KEYS)
    held = b.reasoning._held.peek("t")
    assert held is not None and held.size < 2 * len(WIDE_TEXT)


async def test_an_answer_found_under_none_of_its_keys_any_more_goes(
    two: tuple[Gateway, Gateway], pg: PgDatabase
) -> None:
    a, b = two
    await a.keep("t", "reasoning_content", ["tool:a", "tool:b"], "first")
    await a.keep("t", "reasoning_content", ["tool:a", "tool:b"], "again")  # a retried turn
    await a.keep("t", "anthropic_thinking", ["tool:a"], "another kind")
    await b.keep("t", "reasoning_content", ["tool:b"], "b alone")  # tool:a still finds "again"
    rows = pg.fetch("SELECT kind, keys, seq FROM state_reasoning ORDER BY seq")
    assert [(r["kind"], r["keys"], r["seq"]) for r in rows] == [
        ("reasoning_content", ["tool:a", "tool:b"], 2),
        ("anthropic_thinking", ["tool:a"], 3),
        ("reasoning_content", ["tool:b"], 4),
    ]
    for gateway in (a, b):
        assert await gateway.find("t", "reasoning_content", "tool:a") == "again"
        assert await gateway.find("t", "reasoning_content", "tool:b") == "b alone"
        assert await gateway.find("t", "anthropic_thinking", "tool:a") == "another kind"


async def test_rows_of_the_version_before_become_one_row_per_answer(pg: PgDatabase) -> None:
    """A database the previous version wrote: one row per key, each with a copy of the
    answer's reasoning. Migrated, each answer is one row with its keys, numbered as its
    last key was; a gateway that held the task up to that number reads only what is new."""
    previous = load_state_migrations()[:1]
    assert previous[-1].version == 1

    async def written_by_the_version_before() -> None:
        conn = await asyncpg.connect(pg.url)
        try:
            await apply_migrations(conn, previous, MIGRATIONS_TABLE, MIGRATION_LOCK_KEY)
            await conn.execute(
                "INSERT INTO state_tasks (task, reasoning_seq, written_at) VALUES ('t', 6, now())"
            )
            rows = [
                ("tool:a", 1, "reasoning_content", "qwen", "wide"),
                ("tool:b", 2, "reasoning_content", "qwen", "wide"),
                ("tool:c", 3, "reasoning_content", "qwen", "wide"),
                ("text:1", 4, "reasoning_content", "qwen", "short"),
                ("tool:a", 5, "anthropic_thinking", "qwen", "wide"),
                ("tool:d", 6, "reasoning_content", "other", "wide"),
            ]
            await conn.executemany(
                "INSERT INTO state_reasoning (task, kind, key, seq, provider, profile, data) "
                "VALUES ('t', $3, $1, $2, 'local', $4, $5)",
                [(k, s, kind, p, orjson.dumps(d)) for k, s, kind, p, d in rows],
            )
        finally:
            await conn.close()

    run_async(written_by_the_version_before)
    [gateway] = await opened(pg.url)
    try:
        rows = pg.fetch("SELECT kind, keys, seq, profile FROM state_reasoning ORDER BY seq")
        assert [(r["kind"], r["keys"], r["seq"], r["profile"]) for r in rows] == [
            ("reasoning_content", ["tool:a", "tool:b", "tool:c"], 3, "qwen"),
            ("reasoning_content", ["text:1"], 4, "qwen"),
            ("anthropic_thinking", ["tool:a"], 5, "qwen"),
            ("reasoning_content", ["tool:d"], 6, "other"),
        ]
        call = await gateway.reasoning.task("t")
        wide = call.find("reasoning_content", ["tool:b"])
        assert wide is not None and wide.data == "wide"
        assert call.find("reasoning_content", ["tool:c"]) is wide
        found = call.find("reasoning_content", ["tool:d"])
        assert found is not None and found.profile == "other"
        await gateway.keep("t", "reasoning_content", ["tool:e"], "new")
        assert pg.fetch("SELECT max(seq) AS s FROM state_reasoning") == [{"s": 7}]
        assert await gateway.find("t", "reasoning_content", "tool:e") == "new"
        applied = pg.fetch(f"SELECT version FROM {MIGRATIONS_TABLE} ORDER BY version")
        assert [r["version"] for r in applied] == [m.version for m in load_state_migrations()]
    finally:
        await closed([gateway])


async def test_each_caller_scope_finds_and_replaces_its_own_rows_only(
    two: tuple[Gateway, Gateway],
) -> None:
    """Two callers on one task, on two gateways: the second keeps an answer under the
    first's keys; each finds its own, neither replaced the other's row."""
    a, b = two
    alice, bob = "key:alice", "key:bob"
    first = await a.reasoning.task("t", alice)
    first.keep("reasoning_content", ["tool:call_1"], "local", "qwen", "alice's")
    await first.saved()
    assert (await b.reasoning.task("t", bob)).find("reasoning_content", ["tool:call_1"]) is None
    second = await b.reasoning.task("t", bob)
    second.keep("reasoning_content", ["tool:call_1"], "local", "qwen", "bob's")
    await second.saved()
    for gateway in (a, b):
        for scope, data in ((alice, "alice's"), (bob, "bob's")):
            item = (await gateway.reasoning.task("t", scope)).find(
                "reasoning_content", ["tool:call_1"]
            )
            assert item is not None and (item.data, item.scope) == (data, scope)
        shared = await gateway.reasoning.task("t", TASK_SCOPE)
        assert shared.find("reasoning_content", ["tool:call_1"]) is None


async def test_rows_of_before_scopes_belong_to_everyone_on_the_task(pg: PgDatabase) -> None:
    """A database the version before wrote (no scope): its rows are found by calls that
    share the task, not by a caller key's."""
    previous = load_state_migrations()[:2]
    assert previous[-1].version == 2

    async def written_by_the_version_before() -> None:
        conn = await asyncpg.connect(pg.url)
        try:
            await apply_migrations(conn, previous, MIGRATIONS_TABLE, MIGRATION_LOCK_KEY)
            await conn.execute(
                "INSERT INTO state_tasks (task, reasoning_seq, written_at) VALUES ('t', 1, now())"
            )
            await conn.execute(
                "INSERT INTO state_reasoning (task, seq, kind, keys, provider, profile, data) "
                "VALUES ('t', 1, 'reasoning_content', ARRAY['tool:a'], 'local', 'qwen', $1)",
                orjson.dumps("old"),
            )
        finally:
            await conn.close()

    run_async(written_by_the_version_before)
    [gateway] = await opened(pg.url)
    try:
        shared = (await gateway.reasoning.task("t", TASK_SCOPE)).find(
            "reasoning_content", ["tool:a"]
        )
        assert shared is not None and shared.data == "old"
        keyed = await gateway.reasoning.task("t", "key:alice")
        assert keyed.find("reasoning_content", ["tool:a"]) is None
        # a caller key's answer under the old row's keys leaves the old row alone
        keyed.keep("reasoning_content", ["tool:a"], "local", "qwen", "alice's")
        await keyed.saved()
        rows = pg.fetch("SELECT scope, data FROM state_reasoning ORDER BY seq")
        assert [(r["scope"], orjson.loads(r["data"])) for r in rows] == [
            (TASK_SCOPE, "old"),
            ("key:alice", "alice's"),
        ]
    finally:
        await closed([gateway])
