"""The port a managed llama-server is given: never one given lately, though the OS may
hand it out again before the server that got it binds it."""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest

from boundedcode_gateway.llama_server import launcher


class _PortsInTurn:
    """``socket.socket`` whose bind to port 0 gets the next port of a list."""

    def __init__(self, ports: list[int]) -> None:
        self._ports: Iterator[int] = iter(ports)

    def __call__(self, *args: Any) -> _PortsInTurn:
        return self

    def __enter__(self) -> _PortsInTurn:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def bind(self, address: tuple[str, int]) -> None:
        self._port = next(self._ports)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self._port)


@pytest.fixture(autouse=True)
def _no_recent_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "_RECENT_PORTS", deque[int](maxlen=64))


def test_a_port_the_os_hands_out_twice_is_given_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "socket", _PortsInTurn([41000, 41000, 41001]))
    assert [launcher.free_port(), launcher.free_port()] == [41000, 41001]


def test_no_new_port_in_a_hundred_tries_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "socket", _PortsInTurn([41000] * 101))
    assert launcher.free_port() == 41000
    with pytest.raises(OSError, match="no free port"):
        launcher.free_port()


def test_ports_are_real_and_free() -> None:
    ports = [launcher.free_port() for _ in range(20)]
    assert len(set(ports)) == 20
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))
