"""A request body's pace: its settings (validated, naming key and line), the deadline and
the due time derived from them, and the read that cuts a body falling behind."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.asgi.body_read import BodyPace, ReadingBudget, read_request_body
from boundedcode_gateway.asgi.render import Message
from boundedcode_gateway.config import LimitsSettings, parse_config
from boundedcode_gateway.errors import BodiesOverBudget, BodyTooLarge, BodyTooSlow, ConfigError

CONFIG = """\
data_dir: .gateway
limits:
  header_timeout_s: 2
  {key}: {value}
models:
  local:
    provider: local
    external_url: http://127.0.0.1:8080
"""
KIB = 1024


def test_the_defaults() -> None:
    limits = LimitsSettings()
    assert (limits.body_grace_s, limits.min_body_rate_kib_s, limits.max_body_s) == (5, 64, 60)
    assert limits.max_connections == 512
    assert limits.max_reading_bytes == 48 << 20
    assert BodyPace.of(limits) == BodyPace(5.0, 64.0 * KIB, 60.0)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("body_grace_s", "0", "<c>:4: limits.body_grace_s: Input should be greater than 0"),
        ("min_body_rate_kib_s", "-1", "<c>:4: limits.min_body_rate_kib_s: Input should be"),
        ("max_body_s", "fast", "<c>:4: limits.max_body_s: Input should be a valid number"),
        ("max_connections", "0", "<c>:4: limits.max_connections: Input should be greater"),
        ("max_connections", "1.5", "<c>:4: limits.max_connections: Input should be a valid"),
        ("max_body_s", "3", "<c>:2: limits: body_grace_s (5) exceeds max_body_s (3)"),
        ("max_reading_mib", "0", "<c>:4: limits.max_reading_mib: Input should be greater"),
    ],
)
def test_mistakes_name_key_and_line(key: str, value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(CONFIG.format(key=key, value=value), "<c>")
    assert str(info.value).startswith(expected), str(info.value)


def test_settings_load() -> None:
    text = CONFIG.format(key="min_body_rate_kib_s", value="8")
    limits = parse_config(text + "", "<c>").limits
    assert limits.min_body_rate == 8 * KIB


PACE = BodyPace(grace_s=5.0, min_rate=64.0 * KIB, max_s=60.0)


@pytest.mark.parametrize(
    ("length", "deadline"),
    [(0, 5.0), (100, 5.0 + 100 / (64 * KIB)), (64 * KIB * 10, 15.0), (32 << 20, 60.0)],
)
def test_the_deadline_from_the_length(length: int, deadline: float) -> None:
    assert PACE.deadline_s(length) == pytest.approx(deadline)


@pytest.mark.parametrize(
    ("received", "due"), [(0, 5.0), (64 * KIB, 5.0), (64 * KIB * 8, 8.0), (64 * KIB * 100, 100.0)]
)
def test_more_is_due_when_the_average_would_fall_below_the_rate(received: int, due: float) -> None:
    assert PACE.due_s(received) == pytest.approx(due)


@given(st.integers(0, 1 << 30), st.integers(0, 1 << 30))
def test_the_deadline_never_passes_the_cap_and_grows_with_the_length(a: int, b: int) -> None:
    small, large = sorted((a, b))
    assert PACE.grace_s <= PACE.deadline_s(small) <= PACE.deadline_s(large) <= PACE.max_s


def _scope(length: int | None) -> dict[str, Any]:
    headers = [] if length is None else [(b"content-length", str(length).encode())]
    return {"headers": headers}


def _receiving(pieces: list[tuple[float, bytes]]) -> Any:
    """A ``receive`` giving each piece after its delay; the last one ends the body."""
    queue = list(pieces)

    async def receive() -> Message:
        if not queue:
            await asyncio.sleep(3600)
        delay, body = queue.pop(0)
        await asyncio.sleep(delay)
        return {"type": "http.request", "body": body, "more_body": bool(queue)}

    return receive


FAST = BodyPace(grace_s=0.2, min_rate=1000.0, max_s=1.0)


def test_a_body_that_keeps_the_rate_is_read_whole() -> None:
    pieces = [(0.05, b"x" * 100) for _ in range(10)]  # 2000 bytes/s for 0.5 s
    raw = asyncio.run(read_request_body(_scope(1000), _receiving(pieces), 10_000, FAST))
    assert raw == b"x" * 1000


def test_a_trickle_is_cut_once_the_grace_has_run() -> None:
    pieces = [(0.05, b"x") for _ in range(100)]  # 20 bytes/s

    async def read() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(BodyTooSlow) as info:
            await read_request_body(_scope(100), _receiving(pieces), 10_000, FAST)
        assert info.value.http_status == 408
        assert "below limits.min_body_rate_kib_s" in info.value.message
        return loop.time() - started

    assert 0.2 <= asyncio.run(read()) < 0.4


def test_a_body_that_stops_is_cut_at_its_due_time() -> None:
    # 500 bytes at once, then nothing for long: more is due 0.5 s in (500 bytes at 1000/s)
    pieces = [(0.0, b"x" * 500), (3600.0, b"x" * 300)]

    async def read() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(BodyTooSlow):
            await read_request_body(_scope(800), _receiving(pieces), 10_000, FAST)
        return loop.time() - started

    assert 0.45 <= asyncio.run(read()) < 0.7


def test_a_body_over_its_deadline_is_cut_whatever_its_rate() -> None:
    # 1 MB declared, sent at 5000 bytes/s (above the rate): max_s (1 s) ends it
    pieces = [(0.02, b"x" * 100) for _ in range(200)]

    async def read() -> tuple[float, str]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(BodyTooSlow) as info:
            await read_request_body(_scope(1_000_000), _receiving(pieces), 2_000_000, FAST)
        return loop.time() - started, info.value.message

    elapsed, message = asyncio.run(read())
    assert 1.0 <= elapsed < 1.3
    assert "limits.max_body_s (1 s)" in message


def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    with pytest.raises(BodyTooLarge):
        asyncio.run(read_request_body(_scope(10_001), _receiving([]), 10_000, FAST))


def test_the_budget_refuses_a_body_that_would_pass_it_and_gets_every_byte_back() -> None:
    budget = ReadingBudget(1000)

    async def both() -> None:
        slow = [(0.0, b"x" * 600), (0.3, b"x" * 10)]
        first = asyncio.ensure_future(
            read_request_body(_scope(610), _receiving(slow), 10_000, FAST, budget)
        )
        await asyncio.sleep(0.1)
        assert budget.reading_bytes == 600
        with pytest.raises(BodiesOverBudget) as info:
            await read_request_body(
                _scope(500), _receiving([(0.0, b"y" * 500)]), 10_000, FAST, budget
            )
        assert (info.value.http_status, info.value.code) == (503, "server_busy")
        assert budget.reading_bytes == 600  # the refused body counted nothing
        assert await first == b"x" * 610
        assert budget.reading_bytes == 0
        # a body cut for its pace gives its bytes back as well
        with pytest.raises(BodyTooSlow):
            await read_request_body(
                _scope(900), _receiving([(0.0, b"z" * 100), (3600.0, b"")]), 10_000, FAST, budget
            )
        assert budget.reading_bytes == 0

    asyncio.run(both())


def test_a_body_read_alone_is_never_refused_by_the_budget() -> None:
    budget = ReadingBudget(100)
    pieces = [(0.0, b"x" * 80), (0.0, b"x" * 80), (0.0, b"x" * 80)]
    raw = asyncio.run(read_request_body(_scope(240), _receiving(pieces), 10_000, FAST, budget))
    assert len(raw) == 240 and budget.reading_bytes == 0
