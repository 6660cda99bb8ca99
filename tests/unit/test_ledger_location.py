"""``ledger:``: an SQLite path or a PostgreSQL URL, and a PostgreSQL URL as messages show it
(never its password)."""

from __future__ import annotations

from pathlib import Path

import pytest

from boundedcode_gateway.config import parse_config
from boundedcode_gateway.errors import ConfigError
from boundedcode_gateway.locations import (
    PostgresLocation,
    describe,
    explain,
    parse_ledger_url,
)

MODELS = 'models: {m: {provider: local, external_url: "http://127.0.0.1:9"}}\n'


@pytest.mark.parametrize(
    ("url", "location"),
    [
        ("sqlite:///.gateway/ledger.db", Path(".gateway/ledger.db")),
        ("sqlite:////var/lib/gw/ledger.db", Path("/var/lib/gw/ledger.db")),
        (
            "postgresql://gw@db.internal:5432/gateway",
            PostgresLocation("postgresql://gw@db.internal:5432/gateway"),
        ),
        ("postgres://gw@127.0.0.1/gateway", PostgresLocation("postgres://gw@127.0.0.1/gateway")),
        (
            "postgresql:///gateway?host=/run/postgresql",
            PostgresLocation("postgresql:///gateway?host=/run/postgresql"),
        ),
    ],
)
def test_each_form_names_its_ledger(url: str, location: object) -> None:
    assert parse_ledger_url(url) == location


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://gw@h/db", "must be a sqlite:///PATH or a postgresql://"),
        ("ledger.db", "must be a sqlite:///PATH"),
        ("sqlite:///", "sqlite:/// needs a file path"),
        ("postgresql://gw:pw-77@h:port/db", "in postgresql://gw@h:port/db"),
    ],
)
def test_other_forms_are_refused_with_the_key_and_line(url: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f'data_dir: x\nledger: "{url}"\n{MODELS}', "<c>")
    assert str(info.value).startswith("<c>:2: ledger: ")
    assert message in str(info.value)
    assert "pw-77" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://gw:s3cret@db:5432/gateway", "postgresql://gw@db:5432/gateway"),
        ("postgresql://gw@db/gateway", "postgresql://gw@db/gateway"),
        ("postgresql://db/gateway", "postgresql://db/gateway"),
        (
            "postgres://gw@db/gateway?sslmode=require&password=s3cret",
            "postgres://gw@db/gateway?sslmode=require",
        ),
        ("postgresql://gw:p%40ss@[::1]:5433/g", "postgresql://gw@[::1]:5433/g"),
    ],
)
def test_a_postgresql_url_is_shown_without_its_password(url: str, shown: str) -> None:
    location = PostgresLocation(url)
    assert location.display == shown
    assert str(location) == describe(location) == shown
    assert shown in repr(location)


def test_a_message_quoting_the_password_is_scrubbed() -> None:
    location = PostgresLocation("postgresql://gw:s3cret@db/g?password=other-secret")
    failure = ValueError("could not log in to postgresql://gw:s3cret@db/g as other-secret")
    text = explain(location, failure)
    assert text == "ValueError: could not log in to postgresql://gw:***@db/g as ***"
    # an SQLite ledger's message is left as it is
    assert explain(Path("l.db"), ValueError("x")) == "ValueError: x"


def test_the_configuration_gives_the_ledger_location() -> None:
    config = parse_config(f"data_dir: d\n{MODELS}")
    assert config.ledger_location == config.ledger_path == Path("d/ledger.db")
    config = parse_config(f"ledger: postgresql://gw@db/g\n{MODELS}")
    assert config.ledger_location == PostgresLocation("postgresql://gw@db/g")
    with pytest.raises(ValueError, match="not an SQLite file"):
        _ = config.ledger_path
    assert config.metering.ledger_buffer_records == 100_000
