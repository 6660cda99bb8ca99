"""The port a managed llama-server is given: never one given lately, though the OS may
hand it out again before the server that got it binds it."""

from __future__ import annotations

import socket
from collections import deque

import pytest

from boundedcode_gateway.llama_server import launcher


@pytest.fixture(autouse=True)
def _no_recent_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "_RECENT_PORTS", deque[int](maxlen=64))


def _os_gives(monkeypatch: pytest.MonkeyPatch, ports: list[int]) -> None:
    monkeypatch.setattr(launcher, "_port_the_os_gives", iter(ports).__next__)


def test_a_port_the_os_hands_out_twice_is_given_once(monkeypatch: pytest.MonkeyPatch) -> None:
    _os_gives(monkeypatch, [41000, 41000, 41001])
    assert [launcher.free_port(), launcher.free_port()] == [41000, 41001]


def test_no_new_port_in_a_hundred_tries_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _os_gives(monkeypatch, [41000] * 101)
    assert launcher.free_port() == 41000
    with pytest.raises(OSError, match="no free port"):
        launcher.free_port()


def test_ports_are_real_and_free() -> None:
    ports = [launcher.free_port() for _ in range(20)]
    assert len(set(ports)) == 20
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))
