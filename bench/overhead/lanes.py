"""The lanes: what is sent, how many at once, for how long, and what a right answer looks like."""

from __future__ import annotations

from dataclasses import dataclass

from bench.overhead import payloads
from bench.overhead.http_client import Timing
from bench.overhead.loadgen import Check
from bench.overhead.targets import Route


@dataclass(frozen=True)
class Lane:
    key: str
    title: str
    kind: str  # "openai" or "anthropic": which route of the target it uses
    body: str  # "small" or "agent"
    stream: bool
    concurrency: int
    max_requests: int
    max_seconds: float


def full_lanes(seconds: float) -> list[Lane]:
    """Every lane of the benchmark; ``seconds`` bounds each measurement."""
    return [
        Lane("a-small", "(a) c1 small", "openai", "small", False, 1, 5_000, seconds),
        Lane("a-agent", "(a) c1 50 KB agent", "openai", "agent", False, 1, 5_000, seconds),
        Lane("b-c16", "(b) c16 small", "openai", "small", False, 16, 50_000, seconds),
        Lane("b-c64", "(b) c64 small", "openai", "small", False, 64, 50_000, seconds),
        Lane("d-c1", "(d) stream c1", "openai", "small", True, 1, 2_000, seconds),
        Lane("d-c16", "(d) stream c16", "openai", "small", True, 16, 10_000, seconds),
        Lane("e-c1", "(e) anthropic c1", "anthropic", "small", False, 1, 5_000, seconds),
        Lane("e-stream", "(e) anthropic stream c1", "anthropic", "small", True, 1, 2_000, seconds),
    ]


def body_for(lane: Lane, route: Route, direct: bool) -> bytes:
    """OpenAI-shaped for every target; Anthropic-shaped only when sent direct to the fake."""
    if lane.kind == "anthropic" and direct:
        return payloads.anthropic_body(route.model, lane.stream)
    if lane.body == "agent":
        return payloads.agent_body(route.model)
    return payloads.small_body(route.model, lane.stream)


_LAST_WORD = f' w{payloads.STREAM_CHUNKS - 1}"'.encode()


def check_for(lane: Lane, direct: bool) -> Check:
    """A right answer: 200, and for a stream every chunk up to its proper end."""
    anthropic_direct = lane.kind == "anthropic" and direct

    def check(t: Timing) -> str | None:
        if t.status != 200:
            return f"HTTP {t.status}: {t.body[:200]!r}"
        if not lane.stream:
            return None if b"Hello from the fake upstream." in t.body else f"body: {t.body[:200]!r}"
        end = b"message_stop" if anthropic_direct else b"data: [DONE]"
        if end not in t.body[-200:] or _LAST_WORD not in t.body:
            return f"stream incomplete: ...{t.body[-200:]!r}"
        return None

    return check
