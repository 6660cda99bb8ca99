"""``state:``: a PostgreSQL URL (the ledger's forms and messages), the backend it chooses,
and the history digests such a database holds: the same in every process, packed the
same on every machine."""

from __future__ import annotations

import os
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.config import parse_config
from boundedcode_gateway.errors import ConfigError
from boundedcode_gateway.live_config import restart_only_changes
from boundedcode_gateway.locations import PostgresLocation
from boundedcode_gateway.policy.history_diff import (
    HistoryTracker,
    message_digest,
    pack_digests,
    stable_digest,
    unpack_digests,
)
from boundedcode_gateway.reasoning_store.store import ReasoningStore
from boundedcode_gateway.state.backends import FileTaskState, PostgresTaskState, task_state_for
from boundedcode_gateway.state.pg_history import PostgresHistory
from boundedcode_gateway.state.pg_reasoning import PostgresReasoningStore

MODELS = 'models: {m: {provider: local, external_url: "http://127.0.0.1:9"}}\n'


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://gw@db.internal:5432/gateway",
        "postgres://gw@127.0.0.1/gateway",
        "postgresql:///gateway?host=/run/postgresql",
    ],
)
def test_state_names_a_postgresql_database(url: str) -> None:
    config = parse_config(f"state: {url}\n{MODELS}")
    assert config.state_location == PostgresLocation(url)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:///state.db", "must be a postgresql://user@host:port/db URL"),
        ("mysql://gw@h/db", "must be a postgresql://"),
        ("postgresql://gw:pw-77@h:port/db", "in postgresql://gw@h:port/db"),
    ],
)
def test_other_forms_are_refused_with_the_key_and_line(url: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f'data_dir: x\nstate: "{url}"\n{MODELS}', "<c>")
    assert str(info.value).startswith("<c>:2: state: ")
    assert message in str(info.value)
    assert "pw-77" not in str(info.value)


def test_without_state_the_state_is_files_and_memory(tmp_path: Path) -> None:
    config = parse_config(f"data_dir: {tmp_path}\n{MODELS}")
    assert config.state_location is None
    state = task_state_for(config)
    assert isinstance(state, FileTaskState)
    assert isinstance(state.reasoning, ReasoningStore)
    assert isinstance(state.history, HistoryTracker)
    assert state.database is None
    assert state.where == str(tmp_path / "tasks")


def test_with_state_the_state_is_the_databases() -> None:
    config = parse_config(
        f"state: postgresql://gw:s3cret@db/g\nretention: {{tasks_in_memory: 7}}\n{MODELS}"
    )
    state = task_state_for(config)  # not connected until opened
    assert isinstance(state, PostgresTaskState)
    assert isinstance(state.reasoning, PostgresReasoningStore)
    assert isinstance(state.history, PostgresHistory)
    assert state.where == "the state database postgresql://gw@db/g"
    assert state.reasoning._held._max_keys == state.history._held._max_keys == 7


def test_one_database_setting_holds_the_ledger_and_the_state_unless_they_name_another(
    tmp_path: Path,
) -> None:
    one = parse_config(f"data_dir: {tmp_path}\ndatabase: postgresql://gw@db/g\n{MODELS}")
    assert one.state_location == one.ledger_location == PostgresLocation("postgresql://gw@db/g")
    apart = parse_config(
        f"database: postgresql://gw@db/g\nstate: postgresql://gw@other/s\n"
        f"ledger: sqlite:///{tmp_path}/l.db\n{MODELS}"
    )
    assert apart.state_location == PostgresLocation("postgresql://gw@other/s")
    assert apart.ledger_location == tmp_path / "l.db"
    none = parse_config(f"data_dir: {tmp_path}\n{MODELS}")
    assert (none.state_location, none.ledger_location) == (None, tmp_path / "ledger.db")
    with pytest.raises(ConfigError, match=r"database: .*must be a postgresql://"):
        parse_config(f"database: sqlite:///x.db\n{MODELS}")
    assert restart_only_changes(none, one) == ["database"]


def test_state_takes_effect_at_the_next_start() -> None:
    old = parse_config(MODELS)
    new = parse_config(f"state: postgresql://gw@db/g\n{MODELS}")
    assert restart_only_changes(old, new) == ["state"]


MESSAGES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)


@given(st.lists(MESSAGES, max_size=8))
def test_packed_digests_unpack_to_themselves(messages: list[Any]) -> None:
    digests = array("q", [stable_digest(m) for m in messages])
    packed = pack_digests(digests)
    assert len(packed) == 8 * len(messages)
    assert unpack_digests(packed) == digests


@given(st.dictionaries(st.text(max_size=5), MESSAGES, max_size=6))
def test_key_order_never_counts(message: dict[str, Any]) -> None:
    reordered = dict(reversed(list(message.items())))
    assert stable_digest(reordered) == stable_digest(message)
    assert message_digest(reordered) == message_digest(message)


GOLDEN = {"role": "user", "content": "Say hello."}
# the 64-bit BLAKE2b of {"content":"Say hello.","role":"user"}, little-endian signed: a
# database written by one version of the gateway is read by the next
GOLDEN_DIGEST = int.from_bytes(bytes.fromhex("b0cfa205b9ef80cc"), "little", signed=True)


def test_the_stable_digest_is_the_same_in_every_process() -> None:
    script = (
        "from boundedcode_gateway.policy.history_diff import stable_digest, message_digest;"
        f"print(stable_digest({GOLDEN!r}), message_digest({GOLDEN!r}))"
    )
    seen = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        seen.add((int(out[0]), int(out[1])))
    stable = {s for s, _ in seen}
    keyed = {k for _, k in seen}
    assert stable == {stable_digest(GOLDEN)} == {GOLDEN_DIGEST}
    assert len(keyed) == 2  # what the in-memory table uses differs from process to process


def test_packing_is_little_endian() -> None:
    assert pack_digests(array("q", [1, -2])) == bytes.fromhex("0100000000000000feffffffffffffff")
    assert unpack_digests(bytes.fromhex("0100000000000000feffffffffffffff" + "ab")) == array(
        "q", [1, -2]
    )
