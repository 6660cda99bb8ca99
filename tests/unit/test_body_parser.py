"""The body parser: small bodies at once, large ones in a thread within a byte budget, first
come first served, and a share given back only when its parse is over."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import orjson
import pytest

from boundedcode_gateway.asgi import body as body_module
from boundedcode_gateway.asgi.body import OFF_LOOP_BYTES, BodyParser
from boundedcode_gateway.errors import InvalidRequest

MIB = 1024 * 1024


def large(n: int) -> bytes:
    """A JSON array of about ``n`` MiB."""
    return b"[" + b"0," * (n * MIB // 2) + b"0]"


class Gate:
    """Stands in for the parse: each call blocks until let through, and records what ran."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.release = threading.Event()
        self.lock = threading.Lock()

    def parse(self, raw: bytes) -> Any:
        with self.lock:
            self.started.append(len(raw))
        assert self.release.wait(10)
        return len(raw)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    gate = Gate()
    monkeypatch.setattr(body_module, "_parse_without_gc", gate.parse)
    return gate


async def wait_until(condition: Any) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_a_small_body_parses_on_the_loop(gate: Gate) -> None:
    parser = BodyParser(4 * MIB)
    assert await parser.parse(b'{"a": [1, 2]}') == {"a": [1, 2]}
    assert gate.started == []  # no thread for it
    with pytest.raises(InvalidRequest) as caught:
        await parser.parse(b'{"a": ')
    assert caught.value.code == "invalid_json"


async def test_large_bodies_wait_for_the_budget(gate: Gate) -> None:
    parser = BodyParser(5 * MIB)
    bodies = [large(2), large(2), large(2)]
    jobs = [asyncio.ensure_future(parser.parse(b)) for b in bodies]
    await wait_until(lambda: len(gate.started) == 2)
    await asyncio.sleep(0.05)
    assert len(gate.started) == 2  # the third waits: 6 MiB would pass the budget
    assert parser.parsing_bytes == 2 * len(bodies[0])
    gate.release.set()
    assert await asyncio.gather(*jobs) == [len(b) for b in bodies]
    assert parser.parsing_bytes == 0
    parser.close()


async def test_a_body_larger_than_the_budget_takes_all_of_it(gate: Gate) -> None:
    parser = BodyParser(2 * MIB)
    first = asyncio.ensure_future(parser.parse(large(3)))
    second = asyncio.ensure_future(parser.parse(large(1) + b" "))
    await wait_until(lambda: len(gate.started) == 1)
    assert parser.parsing_bytes == 2 * MIB
    await asyncio.sleep(0.05)
    assert len(gate.started) == 1
    gate.release.set()
    await asyncio.gather(first, second)
    assert parser.parsing_bytes == 0
    parser.close()


async def test_a_caller_that_leaves_gives_its_share_back_when_the_parse_ends(gate: Gate) -> None:
    parser = BodyParser(3 * MIB)
    parsing = asyncio.ensure_future(parser.parse(large(2)))
    waiting = asyncio.ensure_future(parser.parse(large(2)))
    small = large(1)
    behind = asyncio.ensure_future(parser.parse(small))
    await wait_until(lambda: len(gate.started) == 1)
    waiting.cancel()  # left while waiting: the one behind it moves up
    parsing.cancel()  # left while parsing: the thread still holds the memory
    await asyncio.sleep(0.05)
    assert len(gate.started) == 1
    assert parser.parsing_bytes == len(large(2))
    gate.release.set()
    assert await behind == len(small)
    assert parser.parsing_bytes == 0
    parser.close()


async def test_a_large_body_parses_for_real_with_the_collector_restored() -> None:
    parser = BodyParser(64 * MIB)
    raw = orjson.dumps({"model": "m", "x": [[] for _ in range(OFF_LOOP_BYTES)]})
    assert len(raw) > OFF_LOOP_BYTES
    assert gc.isenabled()
    parsed = await parser.parse(raw)
    assert parsed["model"] == "m" and len(parsed["x"]) == OFF_LOOP_BYTES
    assert gc.isenabled()
    with pytest.raises(InvalidRequest):
        await parser.parse(raw[:-1])
    assert gc.isenabled()
    parser.close()
