"""``boundedcode-gateway budgets``: one row per limit of each configured budget, with what
its period spent and what is left."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from boundedcode_gateway.access.keys import key_digest
from boundedcode_gateway.budgets.spent import Holder, HolderSpent, Spent
from boundedcode_gateway.cli.budgets import NO_BUDGETS, budget_rows, format_table, run_budgets
from boundedcode_gateway.config import GatewayConfig, parse_config

DAY = "2026-03-01"


def config(tmp_path: Path, **extra: object) -> GatewayConfig:
    return parse_config(
        yaml.safe_dump(
            {
                "data_dir": str(tmp_path),
                "models": {"m": {"provider": "local", "external_url": "http://127.0.0.1:1"}},
                **extra,
            }
        )
    )


def key(name: str, budget: dict[str, object] | None) -> dict[str, object]:
    entry: dict[str, object] = {"name": name, "sha256": key_digest(name), "models": ["*"]}
    if budget is not None:
        entry["budget"] = budget
    return entry


def test_each_limit_of_each_budget_is_a_row_in_its_period(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        auth={
            "keys": [
                key("ci", {"max_cost_usd": 5.0, "max_tokens": 1000, "per": "day"}),
                key("idle", {"max_evaluated_tokens": 50, "per": "lifetime"}),
                key("free", None),
            ]
        },
        budgets={"task": {"max_tokens": 100, "per": "lifetime"}},
    )
    spent: dict[Holder, HolderSpent] = {
        ("caller", "ci"): HolderSpent(DAY, Spent(1.25, 1500, 10), Spent(9.0, 9000, 90)),
        ("caller", "free"): HolderSpent(DAY, Spent(1.0, 1, 1), Spent(1.0, 1, 1)),
        ("task", "b"): HolderSpent(DAY, Spent(0.0, 5, 5), Spent(0.0, 40, 5)),
        ("task", "a"): HolderSpent("2026-02-28", Spent(0.0, 7, 5), Spent(0.0, 70, 5)),
    }
    # what the calls in flight of gateways sharing their budgets hold
    held: dict[Holder, Spent] = {
        ("caller", "ci"): Spent(0.5, 0, 0),
        ("task", "b"): Spent(0.0, 20, 0),
    }
    assert budget_rows(cfg, spent, DAY, held) == [
        ("caller", "ci", "day", "max_cost_usd", "$1.2500", "$0.5000", "$5.0000", "$3.2500"),
        ("caller", "ci", "day", "max_tokens", "1,500", "0", "1,000", "0"),
        ("caller", "idle", "lifetime", "max_evaluated_tokens", "0", "0", "50", "50"),
        ("task", "a", "lifetime", "max_tokens", "70", "0", "100", "30"),
        ("task", "b", "lifetime", "max_tokens", "40", "20", "100", "40"),
    ]


def test_no_budgets_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert format_table([]) == NO_BUDGETS
    assert run_budgets(config(tmp_path)) == 0
    assert capsys.readouterr().out.strip() == NO_BUDGETS
    assert not (tmp_path / "ledger.db").exists()  # reading never creates the ledger
