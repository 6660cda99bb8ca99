"""Ids that need to be unique, not secret, and the jitter of backoffs.

They draw from a generator of the gateway's own, not the ``random`` module's shared
one, so that a program that seeds or reads that one (a test, a host application)
neither repeats our ids nor sees its sequence move under it. A forked child reseeds
it, as ``random`` does its own, so that workers forked from one parent do not
repeat each other's ids.
"""

from __future__ import annotations

import os
import random

_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

GENERATOR = random.Random()
os.register_at_fork(after_in_child=GENERATOR.seed)


def hex_id(bits: int = 128) -> str:
    """``bits`` random bits as hex digits, zero-padded (no system call per id, as
    ``uuid4`` and ``os.urandom`` make)."""
    return f"{GENERATOR.getrandbits(bits):0{bits // 4}x}"


def base62_id(length: int) -> str:
    return "".join(GENERATOR.choices(_BASE62, k=length))
