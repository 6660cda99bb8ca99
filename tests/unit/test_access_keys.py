"""Caller keys: their form, their digest, the configuration lines printed for them, and a
lookup that compares every configured digest whatever the presented key."""

from __future__ import annotations

import hashlib
import hmac
import re
import string

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.access.keys import KeyRing, key_digest, key_entry_yaml, new_key
from boundedcode_gateway.config import BudgetSettings, KeySettings, parse_config

MODELS = "models: {local: {provider: local, external_url: 'http://127.0.0.1:8080'}}\n"


def settings(name: str, key: str, models: tuple[str, ...] = ("*",)) -> KeySettings:
    return KeySettings(name=name, sha256=key_digest(key), models=models)


def test_a_new_key_is_prefixed_random_url_safe_base64() -> None:
    made = {new_key() for _ in range(50)}
    assert len(made) == 50
    for key in made:
        assert re.fullmatch(r"bcg_[A-Za-z0-9_-]{43}", key), key


def test_the_digest_is_sha256_hex() -> None:
    assert key_digest("abc") == ("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")


@given(
    digest=st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    name=st.text(alphabet=string.printable.strip(), min_size=1, max_size=64),
    admin=st.booleans(),
)
def test_the_printed_lines_read_back_as_the_same_key(digest: str, name: str, admin: bool) -> None:
    # a digest of digits, or digits and one "e", would be a number unless quoted
    config = parse_config(key_entry_yaml(name, digest, ("local", "*"), admin) + MODELS)
    assert config.auth is not None
    (entry,) = config.auth.keys
    assert (entry.name, entry.sha256, entry.models, entry.admin) == (
        name,
        digest,
        ("local", "*"),
        admin,
    )


def test_a_digest_of_digits_stays_a_string() -> None:
    digest = "1" * 63 + "0"
    text = key_entry_yaml("ci", digest, ("local",), admin=False)
    assert yaml.safe_load(text)["auth"]["keys"][0]["sha256"] == digest


def test_the_ring_finds_the_caller_of_each_key() -> None:
    budget = BudgetSettings(max_tokens=1000)
    ring = KeyRing(
        [
            settings("ci", "key-one", ("local",)),
            KeySettings(
                name="ops", sha256=key_digest("key-two"), models=("*",), admin=True, budget=budget
            ),
        ]
    )
    ci = ring.find("key-one")
    ops = ring.find("key-two")
    assert ci is not None and ops is not None
    assert (ci.name, ci.kind, ci.models, ci.admin, ci.task) == (
        "ci",
        "key",
        frozenset({"local"}),
        False,
        None,
    )
    assert (ops.name, ops.admin, ops.budget) == ("ops", True, budget)
    assert ring.find("key-three") is None
    assert ring.find("") is None
    assert ring.find(key_digest("key-one")) is None  # the digest is not the key


NAMES = ("first", "middle", "last")


@pytest.mark.parametrize("presented", ["first", "middle", "last", "unknown", ""])
def test_every_configured_digest_is_compared_whatever_the_key(
    monkeypatch: pytest.MonkeyPatch, presented: str
) -> None:
    ring = KeyRing([settings(n, n) for n in NAMES])
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    found = ring.find(presented)
    assert (found.name if found else None) == (presented if presented in NAMES else None)
    # one comparison per configured key, none cut short, each of the presented key's digest
    assert len(compared) == 3
    assert {a for a, _ in compared} == {hashlib.sha256(presented.encode()).digest()}
    assert [b for _, b in compared] == [hashlib.sha256(n.encode()).digest() for n in NAMES]
