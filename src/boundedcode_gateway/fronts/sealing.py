"""What the gateway hands a caller to give back unchanged, made so it can tell.

A front may give a caller something of the upstream's that the caller is to send
back with its next request: Anthropic's Messages front a thinking block with its
``signature``, the Responses front a reasoning item's ``encrypted_content``. The
gateway signs the first (HMAC-SHA256) and encrypts the second (Fernet: AES-128-CBC
with an HMAC), with one key kept in ``data_dir/front-seal.key`` (made at first
start, readable by its owner only). Several gateways that serve the same callers
share the file. A key file open to anyone but its owner is refused, not tightened:
whoever read it can forge and open seals, so the operator is to decide whether to
keep it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from boundedcode_gateway import private_files
from boundedcode_gateway.errors import ConfigError

KEY_FILE = "front-seal.key"
# tells the gateway's signatures from anyone else's, and their version
SIGNATURE_PREFIX = "bcg1."


class Sealer:
    """Signs and checks, seals and opens, with one key."""

    __slots__ = ("_fernet", "_mac_key")

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("the seal key is 32 bytes")
        self._mac_key = hashlib.sha256(b"sign:" + key).digest()
        fernet_key = hashlib.sha256(b"seal:" + key).digest()
        self._fernet = Fernet(base64.urlsafe_b64encode(fernet_key))

    @classmethod
    def in_folder(cls, folder: Path) -> Sealer:
        """The sealer of the key in ``folder``, made there (mode 0600) if it is not yet; a
        ``ConfigError`` for a key file others may read or write."""
        path = folder / KEY_FILE
        private_files.make_folder(folder)
        try:
            out = private_files.create_new(path)
        except FileExistsError:
            return cls(_read_key(path))
        with out:
            key = os.urandom(32)
            out.write(key)
        return cls(key)

    def sign(self, text: str) -> str:
        """A signature of ``text`` that only this key makes."""
        # surrogatepass: a text a caller sent (a thinking block's) is signed as it came
        data = text.encode("utf-8", "surrogatepass")
        mac = hmac.new(self._mac_key, data, hashlib.sha256).digest()
        return SIGNATURE_PREFIX + base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def verify(self, text: str, signature: str) -> bool:
        """Whether ``signature`` is this key's signature of ``text``: any string a caller
        sent, so compared as bytes (``compare_digest`` refuses a ``str`` outside ASCII,
        which no signature of this key holds)."""
        presented = signature.encode("utf-8", "surrogatepass")
        return hmac.compare_digest(self.sign(text).encode("ascii"), presented)

    def seal(self, data: bytes) -> str:
        """``data`` encrypted and authenticated, as text."""
        return self._fernet.encrypt(data).decode()

    def open(self, token: str) -> bytes | None:
        """What ``seal`` sealed; None for anything this key did not seal."""
        try:
            return self._fernet.decrypt(token.encode())
        except (InvalidToken, ValueError):
            return None


def _read_key(path: Path) -> bytes:
    """The key in ``path``, which must be its owner's alone."""
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
