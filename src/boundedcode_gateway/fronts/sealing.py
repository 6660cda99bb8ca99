"""What the gateway hands a caller to give back unchanged, made so it can tell.

A front may give a caller something of the upstream's that the caller is to send
back with its next request: Anthropic's Messages front a thinking block with its
``signature``, the Responses front a reasoning item's ``encrypted_content``. The
gateway signs the first (HMAC-SHA256) and encrypts the second (Fernet: AES-128-CBC
with an HMAC), with one key kept in ``data_dir/front-seal.key`` (made at first
start, readable by its owner only). Several gateways that serve the same callers
share the file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

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
        """The sealer of the key in ``folder``, made there (mode 0600) if it is not yet."""
        path = folder / KEY_FILE
        folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls(path.read_bytes())
        with os.fdopen(fd, "wb") as out:
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
