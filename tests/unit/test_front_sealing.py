"""The fronts' key: made once, readable by its owner only; signatures and seals that
only it makes and opens."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.fronts.sealing import KEY_FILE, SIGNATURE_PREFIX, Sealer

ONE = Sealer(b"\x01" * 32)
OTHER = Sealer(b"\x02" * 32)


def test_the_key_is_made_once_for_its_owner_only(tmp_path: Path) -> None:
    first = Sealer.in_folder(tmp_path / "data")
    key = tmp_path / "data" / KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    again = Sealer.in_folder(tmp_path / "data")
    assert again.verify("text", first.sign("text"))
    assert again.open(first.seal(b"reasoning")) == b"reasoning"


def test_a_key_of_another_size_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        Sealer(b"short")


@given(st.text())
def test_a_signature_checks_its_own_text_and_key_only(text: str) -> None:
    signature = ONE.sign(text)
    assert signature.startswith(SIGNATURE_PREFIX)
    assert ONE.verify(text, signature)
    assert not ONE.verify(text + "x", signature)
    assert not OTHER.verify(text, signature)


@given(st.binary())
def test_a_seal_opens_with_its_key_only(data: bytes) -> None:
    token = ONE.seal(data)
    assert ONE.open(token) == data
    assert OTHER.open(token) is None
    # a character inside the token (the last ones may hold only padding bits) changed
    middle = len(token) // 2
    tampered = token[:middle] + ("A" if token[middle] != "A" else "B") + token[middle + 1 :]
    assert ONE.open(tampered) is None
    assert ONE.open("not a token") is None


# every code point, lone surrogates included (st.text leaves them out)
ANY_TEXT = st.text(st.characters(exclude_categories=()))


@given(ANY_TEXT, ANY_TEXT)
def test_any_string_a_caller_sends_is_checked_never_raised_on(text: str, signature: str) -> None:
    sealer = Sealer(bytes(32))
    assert sealer.verify(text, signature) is (signature == sealer.sign(text))
    assert sealer.verify(text, sealer.sign(text)) is True
    assert sealer.open(signature) is None
