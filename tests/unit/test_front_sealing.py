"""The fronts' key ring: made once, readable by its owner only, rotated with the previous
key still verifying; signatures and seals that only its keys make and open, each taken
back only for the task and caller scope it was made for, and not once too old."""

from __future__ import annotations

import base64
import hashlib
import hmac
import stat
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.call_context import TASK_SCOPE, TOKENS_SCOPE
from boundedcode_gateway.fronts.sealing import (
    CLOCK_SKEW_S,
    KEY_FILE,
    SEAL_PREFIX,
    SIGNATURE_PREFIX,
    SealBinding,
    Sealer,
    key_id,
    rotate_ring,
)

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


# Bound to where they were handed out: task, caller scope, key, age.

NOW = 1_800_000_000.0
KEY_A, KEY_B = b"\x0a" * 32, b"\x0b" * 32
TASK_A = SealBinding("task-a", "key:alice")


class Clock:
    """A clock the test moves."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def sealers(clock: Clock, ring: tuple[bytes, ...] = (KEY_A,), max_age_s: int = 3600) -> Sealer:
    return Sealer(ring, max_age_s=max_age_s, clock=clock)


ELSEWHERE = {
    "another task": SealBinding("task-b", "key:alice"),
    "another caller": SealBinding("task-a", "key:bob"),
    "the task's tokens": SealBinding("task-a", TOKENS_SCOPE),
    "everyone on the task": SealBinding("task-a", TASK_SCOPE),
}


@pytest.mark.parametrize("where", list(ELSEWHERE))
def test_a_signature_or_seal_is_taken_back_where_it_was_made_only(where: str) -> None:
    base = sealers(Clock())
    here, there = base.bound(TASK_A), base.bound(ELSEWHERE[where])
    signature, sealed = here.sign("text"), here.seal(b"reasoning")
    assert here.verify("text", signature) and here.open(sealed) == b"reasoning"
    assert not there.verify("text", signature)
    assert there.open(sealed) is None


def test_an_expired_signature_or_seal_is_refused() -> None:
    clock = Clock()
    sealer = sealers(clock, max_age_s=3600).bound(TASK_A)
    signature, sealed = sealer.sign("text"), sealer.seal(b"reasoning")
    clock.now = NOW + 3600
    assert sealer.verify("text", signature) and sealer.open(sealed) == b"reasoning"
    clock.now = NOW + 3601
    assert not sealer.verify("text", signature)
    assert sealer.open(sealed) is None
    # nor one made by a gateway whose clock runs well ahead
    clock.now = NOW - CLOCK_SKEW_S - 1
    assert not sealer.verify("text", signature)
    assert sealer.open(sealed) is None


def test_after_a_rotation_the_previous_key_verifies_until_it_is_removed(tmp_path: Path) -> None:
    clock = Clock()
    before = Sealer.in_folder(tmp_path, clock=clock).bound(TASK_A)
    signature, sealed = before.sign("text"), before.seal(b"reasoning")
    ring, removed = rotate_ring(tmp_path, keep=2)
    assert len(ring) == 2 and removed == ()
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    after = Sealer.in_folder(tmp_path, clock=clock).bound(TASK_A)
    assert after.key_ids == [key_id(k) for k in ring]
    assert after.verify("text", signature) and after.open(sealed) == b"reasoning"
    # the new key signs, and the ring's last key is not it
    assert after.sign("text").split(".")[1] == key_id(ring[0]) != signature.split(".")[1]
    ring, removed = rotate_ring(tmp_path, keep=2)
    assert len(removed) == 1 and len(ring) == 2
    rotated_out = Sealer.in_folder(tmp_path, clock=clock).bound(TASK_A)
    assert not rotated_out.verify("text", signature)
    assert rotated_out.open(sealed) is None


def test_a_reload_swaps_the_ring_of_every_sealer_bound_after_it(tmp_path: Path) -> None:
    base = Sealer.in_folder(tmp_path)
    old = base.bound(TASK_A).sign("text")
    ring, _ = rotate_ring(tmp_path, keep=1)
    base.use_ring(ring)
    assert base.bound(TASK_A).sign("text").split(".")[1] == key_id(ring[0])
    assert not base.bound(TASK_A).verify("text", old)


def test_the_single_key_file_of_before_is_a_ring_of_one(tmp_path: Path) -> None:
    (tmp_path / KEY_FILE).write_bytes(KEY_A)
    (tmp_path / KEY_FILE).chmod(0o600)
    clock = Clock()
    from_file = Sealer.in_folder(tmp_path, clock=clock).bound(TASK_A)
    assert from_file.key_ids == [key_id(KEY_A)]
    assert from_file.verify("text", sealers(clock).bound(TASK_A).sign("text"))


def test_a_key_file_of_a_broken_length_is_refused(tmp_path: Path) -> None:
    (tmp_path / KEY_FILE).write_bytes(KEY_A + b"\x00" * 5)
    (tmp_path / KEY_FILE).chmod(0o600)
    with pytest.raises(ValueError, match="32 bytes each"):
        Sealer.in_folder(tmp_path)


def test_the_earlier_forms_bound_only_the_profile_and_are_refused() -> None:
    """``bcg1.`` and the HMAC of the text alone; a Fernet token without prefix or binding."""
    sealer = sealers(Clock()).bound(TASK_A)
    mac_key = hashlib.sha256(b"sign:" + KEY_A).digest()
    mac = hmac.new(mac_key, b"text", hashlib.sha256).digest()
    old_signature = "bcg1." + base64.urlsafe_b64encode(mac).decode().rstrip("=")
    old_seal = Fernet(
        base64.urlsafe_b64encode(hashlib.sha256(b"seal:" + KEY_A).digest())
    ).encrypt_at_time(b"reasoning", int(NOW))
    assert not sealer.verify("text", old_signature)
    assert sealer.open(old_seal.decode()) is None


@given(ANY_TEXT, ANY_TEXT)
def test_any_string_is_checked_by_a_bound_ring_never_raised_on(text: str, token: str) -> None:
    sealer = sealers(Clock(), ring=(KEY_A, KEY_B)).bound(TASK_A)
    assert sealer.verify(text, token) is False or token == sealer.sign(text)
    assert sealer.open(token) is None
    prefixed = f"{SIGNATURE_PREFIX}{key_id(KEY_B)}.{int(NOW)}.{token}"
    assert sealer.verify(text, prefixed) is False
    assert sealer.open(f"{SEAL_PREFIX}{key_id(KEY_B)}.{token}") is None
