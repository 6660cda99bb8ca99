"""The suite's guard refuses connections off the loopback interface."""

from __future__ import annotations

import socket

import pytest


def test_non_loopback_connect_is_refused() -> None:
    with socket.socket() as s, pytest.raises(AssertionError, match="non-loopback"):
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed


def test_loopback_is_allowed() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.socket() as client:
            client.connect(server.getsockname())
