"""Suite-wide guard: no test may open a connection beyond the loopback interface; and the
PostgreSQL fixture."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import pytest

# the `pg` fixture: a fresh PostgreSQL database per test
pytest_plugins = ("tests.postgres_db",)

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _check(address: Any) -> None:
    if not isinstance(address, tuple):
        return  # unix sockets
    host = address[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if host == "localhost":
            return
        raise AssertionError(f"test tried to resolve and connect to {host!r}") from None
    if not ip.is_loopback:
        raise AssertionError(f"test tried to connect to non-loopback address {host}")


def _guarded_connect(self: socket.socket, address: Any) -> None:
    _check(address)
    _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    _check(address)
    return _real_connect_ex(self, address)


@pytest.fixture(autouse=True, scope="session")
def loopback_only() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", _guarded_connect)
        patch.setattr(socket.socket, "connect_ex", _guarded_connect_ex)
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Close the event loop a synchronous client left as the thread's current loop.

    LiteLLM's synchronous calls take ``asyncio.get_event_loop()``, which makes a loop
    and leaves it open; collected later, inside some other test, its ResourceWarning
    fails that test. A fresh policy afterwards lets the next such call make its own.
    """
    yield
    policy = asyncio.get_event_loop_policy()
    loop = getattr(getattr(policy, "_local", None), "_loop", None)
    if isinstance(loop, asyncio.AbstractEventLoop) and not loop.is_running():
        if not loop.is_closed():
            loop.close()
        asyncio.set_event_loop_policy(None)
