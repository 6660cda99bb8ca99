"""A stream whose event never ends in lines that carry no data: empty ``data`` lines
(plain and gzipped), comments, unknown fields. Each line counts toward
``inference.upstream_limits.max_event_mib``, so the call is cut with a 502 once the event
passes it, and the gateway's memory stays bounded however many such lines come.
"""

from __future__ import annotations

import gzip
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import Gateway, GatewayFactory
from tests.fakes.hostile import HostileUpstream, Play, Step, stream_head
from tests.memory import GROWTH_LIMIT, PeakRss

KEY_ENV = "FLOOD_UPSTREAM_KEY"
FLOOD_BYTES = 63_000_000
PIECE_LINES = 13_000  # 65 KB of "data\n" a write
# what the gateway may grow by while the flood lasts (it grew by 98 MiB before each
# line counted)


@pytest.fixture
def hostile(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostileUpstream]:
    monkeypatch.setenv(KEY_ENV, "sk-flood-test-key")
    upstream = HostileUpstream().start()
    yield upstream
    upstream.stop()


def start(start_gateway: GatewayFactory, upstream: HostileUpstream) -> Gateway:
    profile = {
        "provider": "openai",
        "model": "gpt-5.1",
        "api_key_env": KEY_ENV,
        "base_url": upstream.url + "/v1",
    }
    return start_gateway({"flood": profile}, inference={"read_timeout_s": 10})


def flood(line: bytes) -> list[Step]:
    """``FLOOD_BYTES`` of ``line``, written a piece at a time (one piece object, many refs:
    the upstream holds no copy of the whole)."""
    piece = line * (PIECE_LINES * 5 // len(line))
    return [piece] * (FLOOD_BYTES // len(piece))


def flood_steps(kind: str) -> list[Step]:
    if kind == "gzip-empty-data":  # 63 MB in about 100 KB on the wire
        gzipped = gzip.compress(b"data\n" * (FLOOD_BYTES // 5), 9)
        return [stream_head({"Content-Encoding": "gzip"}), gzipped]
    line = {"empty-data": b"data\n", "comments": b":\n", "unknown-fields": b"x\n"}[kind]
    return [stream_head(), *flood(line)]


FLOODS = ["empty-data", "gzip-empty-data", "comments", "unknown-fields"]


@pytest.mark.parametrize("kind", FLOODS)
def test_a_flood_of_lines_without_data_is_cut_at_the_event_limit(
    start_gateway: GatewayFactory, hostile: HostileUpstream, kind: str
) -> None:
    hostile.queue(Play(flood_steps(kind)))
    gw = start(start_gateway, hostile)
    body = {"model": "flood", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.Client(timeout=60) as client:
        client.get(gw.url + "/health")  # the gateway's own first-use costs, before measuring
        started = time.monotonic()
        with PeakRss() as rss:
            resp = client.post(gw.url + "/v1/chat/completions", json=body)
        took = time.monotonic() - started
    print(f"{kind}: {resp.status_code}, +{rss.growth / (1 << 20):.1f} MiB in {took:.2f} s")
    assert resp.status_code == 502, resp.text
    error = resp.json()["error"]
    assert error["code"] == "upstream_response_too_large"
    assert "inference.upstream_limits.max_event_mib (8 MiB)" in error["message"]
    assert rss.growth < GROWTH_LIMIT, f"grew by {rss.growth / (1 << 20):.0f} MiB"
    assert len(hostile.requests) == 1
    if kind != "gzip-empty-data":  # that flood is all written before the gateway reads it
        assert hostile.client_left.wait(5), "the gateway read on past the limit"
    calls = gw.calls()
    assert [(c["http_status"], c["error_code"]) for c in calls] == [
        (502, "upstream_response_too_large")
    ]
