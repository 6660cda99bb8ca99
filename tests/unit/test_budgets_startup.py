"""The gateway's start-up reads the budgets' spending from the ledger, or refuses to start
without it: a budget is not enforced blind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from boundedcode_gateway.app import GatewayApp
from boundedcode_gateway.config import parse_config


def app(tmp_path: Path, **extra: Any) -> GatewayApp:
    text = yaml.safe_dump(
        {
            "data_dir": str(tmp_path),
            # nothing listens there: capabilities stay unknown, which start-up allows
            "models": {"m": {"provider": "local", "external_url": "http://127.0.0.1:9"}},
            **extra,
        }
    )
    return GatewayApp(parse_config(text))


def unreadable_ledger(tmp_path: Path) -> None:
    (tmp_path / "ledger.db").write_bytes(b"this is not an SQLite database" * 100)


async def test_a_ledger_that_cannot_be_read_stops_a_start_with_budgets(tmp_path: Path) -> None:
    unreadable_ledger(tmp_path)
    gateway = app(tmp_path, budgets={"task": {"max_tokens": 10}})
    try:
        with pytest.raises(RuntimeError, match="cannot read the budgets' spending"):
            await gateway.startup()
    finally:
        await gateway.shutdown()


async def test_without_budgets_the_ledger_is_not_read_at_start(tmp_path: Path) -> None:
    unreadable_ledger(tmp_path)
    gateway = app(tmp_path)
    assert gateway.budgets is None
    try:
        await gateway.startup()
    finally:
        await gateway.shutdown()


async def test_without_metering_budgets_start_from_nothing(tmp_path: Path) -> None:
    unreadable_ledger(tmp_path)
    gateway = app(tmp_path, metering=False, budgets={"task": {"max_tokens": 10}})
    try:
        await gateway.startup()
        assert gateway.budgets is not None
    finally:
        await gateway.shutdown()
