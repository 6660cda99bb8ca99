"""What the gateway hands a caller to give back unchanged, made so it can tell.

A front may give a caller something of the upstream's that the caller is to send
back with its next request: Anthropic's Messages front a thinking block with its
``signature``, the Responses front a reasoning item's ``encrypted_content``. The
gateway signs the first (HMAC-SHA256) and encrypts the second (Fernet: AES-128-CBC
with an HMAC).

Each is bound to where it was handed out: its format's version, the id of the key that
made it, the task and the caller scope of the call (``call_context.py``; the profile is
in what is signed or sealed), and the time it was made. It is taken back only in a call
of the same task and scope, within ``reasoning.seal_max_age_days`` of that time, under a
key the ring still holds; anything else is treated as the gateway's own refusal of an
unknown block is (dropped, never an error). Those of the earlier form (``bcg1.``, and
bare Fernet tokens) bound only the profile: they are refused too.

The keys are a ring in ``data_dir/front-seal.key`` (made at first start, readable by its
owner only; a key file open to anyone but its owner is refused, not tightened: whoever
read it can forge and open seals, so the operator is to decide whether to keep it): 32
bytes a key, newest first. The newest signs and seals; every key in the
ring verifies and opens, so a rotation (``boundedcode-gateway seal-key rotate``) keeps
what the previous key made good until that key is removed. A file of one key, the
earlier form, is a ring of one. Several gateways that serve the same callers share the
file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from boundedcode_gateway import private_files
from boundedcode_gateway.call_context import TASK_SCOPE
from boundedcode_gateway.errors import ConfigError

KEY_FILE = "front-seal.key"
KEY_BYTES = 32
# tells the gateway's signatures and seals from anyone else's, and their version
SIGNATURE_PREFIX = "bcg2."
SEAL_PREFIX = "bcs2."
DEFAULT_MAX_AGE_S = 30 * 86400
# how far ahead of this one the clock of another gateway sharing the ring may run
CLOCK_SKEW_S = 60
_KEY_ID_CHARS = 8
# prefix, key id, issued at (seconds since the epoch), HMAC-SHA256 (43 characters)
_SIGNATURE = re.compile(r"bcg2\.([A-Za-z0-9_-]{8})\.([0-9]{1,12})\.([A-Za-z0-9_-]{43})")

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class SealBinding:
    """Where a signature or seal is taken back: the call's task and caller scope."""

    task: str
    scope: str


# what a sealer not yet bound to a call uses (the fronts bind one for each call)
UNBOUND = SealBinding("", TASK_SCOPE)


def key_id(key: bytes) -> str:
    """The name of a key in signatures and seals: derived from it, telling nothing of it."""
    digest = hashlib.sha256(b"front-seal key id:" + key).digest()
    return base64.urlsafe_b64encode(digest).decode()[:_KEY_ID_CHARS]


def parse_ring(raw: bytes) -> tuple[bytes, ...]:
    """The keys of a key file, newest first."""
    if not raw or len(raw) % KEY_BYTES:
        raise ValueError(f"the seal key file holds keys of {KEY_BYTES} bytes each")
    return tuple(raw[i : i + KEY_BYTES] for i in range(0, len(raw), KEY_BYTES))


def read_ring(folder: Path) -> tuple[bytes, ...]:
    """The ring of ``folder``'s key file, made there (mode 0600, one key) if it is not
    yet; a ``ConfigError`` for a key file others may read or write. Blocking: at start,
    on a reload off the event loop, or on the command line."""
    path = folder / KEY_FILE
    private_files.make_folder(folder)
    try:
        out = private_files.create_new(path)
    except FileExistsError:
        return parse_ring(_read_key_file(path))
    key = os.urandom(KEY_BYTES)
    with out:
        out.write(key)
    return (key,)


def _read_key_file(path: Path) -> bytes:
    """The bytes of ``path``, which must be its owner's alone."""
    with path.open("rb") as f:
        st = os.fstat(f.fileno())
        if private_files.open_to_others(st):
            raise ConfigError(
                f"the seal key {path} is open to others (mode {private_files.mode_of(st):04o}): "
                "whoever can read it can forge the gateway's signatures and open what it "
                f"sealed. Run `chmod 600 {path}` if nobody else can have read it; otherwise "
                "remove it, and the gateway makes a new key at its next start (seals made "
                "with the old one are then no longer given back)"
            )
        return f.read()


def write_ring(folder: Path, ring: Sequence[bytes]) -> None:
    """Replace ``folder``'s key file with ``ring`` at once (a reader sees the old file or
    the new, never part of one), readable by its owner only."""
    path = folder / KEY_FILE
    partial = path.with_name(f"{KEY_FILE}.{os.getpid()}.new")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(b"".join(ring))
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def rotate_ring(folder: Path, keep: int) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """A new key put first in ``folder``'s ring, and the keys beyond the ``keep`` newest
    (the new one counted) removed: the ring now, and the keys removed."""
    if keep < 1:
        raise ValueError("a rotation keeps at least the new key")
    ring = (os.urandom(KEY_BYTES), *read_ring(folder))
    kept, removed = ring[:keep], ring[keep:]
    write_ring(folder, kept)
    return kept, removed


def _framed(*parts: str) -> bytes:
    """The parts as bytes no other parts give: each its length, a colon, itself."""
    out = bytearray()
    for part in parts:
        # surrogatepass: a text a caller sent (a thinking block's) is signed as it came
        encoded = part.encode("utf-8", "surrogatepass")
        out += b"%d:" % len(encoded)
        out += encoded
    return bytes(out)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class _Key:
    """One key of the ring, as the two uses derive it."""

    __slots__ = ("fernet", "key_id", "mac_key")

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"the seal key is {KEY_BYTES} bytes")
        self.key_id = key_id(key)
        self.mac_key = hashlib.sha256(b"sign:" + key).digest()
        fernet_key = hashlib.sha256(b"seal:" + key).digest()
        self.fernet = Fernet(base64.urlsafe_b64encode(fernet_key))


class _Ring:
    """The keys: the newest signs and seals, every one verifies and opens."""

    __slots__ = ("by_id", "ids", "newest")

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("the seal key ring holds no key")
        derived = [_Key(k) for k in keys]
        self.newest = derived[0]
        self.ids = tuple(k.key_id for k in derived)
        self.by_id = {k.key_id: k for k in derived}


class Sealer:
    """Signs and checks, seals and opens, with the ring's keys, for one binding.

    ``Sealer(key)`` or ``Sealer(ring)``; ``bound`` gives the sealer of one call. A
    ``Sealer`` shares its ring with the sealers bound from it, so ``use_ring`` (a reload)
    reaches every call that starts after it.
    """

    __slots__ = ("_binding", "_clock", "_max_age_s", "_ring")

    def __init__(
        self,
        keys: bytes | Sequence[bytes],
        *,
        max_age_s: int = DEFAULT_MAX_AGE_S,
        clock: Clock = time.time,
    ) -> None:
        ring = (keys,) if isinstance(keys, bytes) else tuple(keys)
        # a list, so that a ring swapped in is seen by the sealers bound from this one
        self._ring = [_Ring(ring)]
        self._binding = UNBOUND
        self._max_age_s = max_age_s
        self._clock = clock

    @classmethod
    def in_folder(
        cls, folder: Path, *, max_age_s: int = DEFAULT_MAX_AGE_S, clock: Clock = time.time
    ) -> Sealer:
        """The sealer of the ring in ``folder``, made there (mode 0600) if it is not yet."""
        return cls(read_ring(folder), max_age_s=max_age_s, clock=clock)

    def bound(self, binding: SealBinding) -> Sealer:
        """This sealer for the calls of ``binding``'s task and scope."""
        other = object.__new__(Sealer)
        other._ring = self._ring
        other._binding = binding
        other._max_age_s = self._max_age_s
        other._clock = self._clock
        return other

    def use_ring(self, keys: Sequence[bytes]) -> None:
        """Sign with a new ring from now on, and verify with it (a rotation, on a reload)."""
        self._ring[0] = _Ring(keys)

    def use_max_age(self, max_age_s: int) -> None:
        """Refuse what is older than ``max_age_s`` in the calls bound from now on."""
        self._max_age_s = max_age_s

    @property
    def key_ids(self) -> list[str]:
        """The ids of the ring's keys, the signing one first."""
        return list(self._ring[0].ids)

    def _signed(self, key: _Key, issued: int, text: str) -> bytes:
        b = self._binding
        head = _framed(SIGNATURE_PREFIX, key.key_id, str(issued), b.task, b.scope)
        return head + text.encode("utf-8", "surrogatepass")

    def _signature(self, key: _Key, issued: int, text: str) -> str:
        mac = hmac.new(key.mac_key, self._signed(key, issued, text), hashlib.sha256).digest()
        return f"{SIGNATURE_PREFIX}{key.key_id}.{issued}.{_b64(mac)}"

    def _fresh(self, issued: float, now: float) -> bool:
        return issued <= now + CLOCK_SKEW_S and now - issued <= self._max_age_s

    def sign(self, text: str) -> str:
        """A signature of ``text`` for this binding, now, that only the ring's keys make."""
        return self._signature(self._ring[0].newest, int(self._clock()), text)

    def verify(self, text: str, signature: str) -> bool:
        """Whether ``signature`` is a signature of ``text`` for this binding, by a key of
        the ring, not too old: any string a caller sent, so read by a pattern of ASCII
        only before anything is computed (``compare_digest`` refuses a ``str`` outside
        ASCII)."""
        match = _SIGNATURE.fullmatch(signature)
        if match is None:
            return False
        key = self._ring[0].by_id.get(match.group(1))
        issued = int(match.group(2))
        if key is None or not self._fresh(issued, self._clock()):
            return False
        expected = self._signature(key, issued, text)
        return hmac.compare_digest(expected.encode("ascii"), signature.encode("ascii"))

    def _head(self, key: _Key) -> bytes:
        return _framed(SEAL_PREFIX, key.key_id, self._binding.task, self._binding.scope)

    def seal(self, data: bytes) -> str:
        """``data`` encrypted and authenticated for this binding, as text."""
        key = self._ring[0].newest
        token = key.fernet.encrypt_at_time(self._head(key) + data, int(self._clock()))
        return f"{SEAL_PREFIX}{key.key_id}.{token.decode()}"

    def open(self, token: str) -> bytes | None:
        """What ``seal`` sealed for this binding; None for anything else (another binding,
        too old, a key no longer in the ring, not a seal)."""
        if not token.startswith(SEAL_PREFIX):
            return None
        kid, _, rest = token[len(SEAL_PREFIX) :].partition(".")
        key = self._ring[0].by_id.get(kid)
        if key is None:
            return None
        try:
            # the ttl and the clock skew Fernet allows: the same bounds as a signature's
            plain = key.fernet.decrypt_at_time(
                rest.encode("ascii"), self._max_age_s, int(self._clock())
            )
        except (InvalidToken, ValueError):  # UnicodeEncodeError is a ValueError
            return None
        head = self._head(key)
        return plain[len(head) :] if plain.startswith(head) else None
