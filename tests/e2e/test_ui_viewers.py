"""The page of calls' event stream: a viewer is told of the calls in flight first, and
viewers beyond the limit are turned away with a 429 rather than a server error."""

from __future__ import annotations

import httpx

from tests.e2e.conftest import Gateway


def test_a_viewer_beyond_the_limit_gets_a_429(gateway: Gateway) -> None:
    gateway.app.events._max_viewers = 1
    url = gateway.url + "/ui/api/events"
    with httpx.stream("GET", url, timeout=5) as first:
        lines = first.iter_lines()  # held: the stream closes with it
        assert first.status_code == 200 and next(lines) == "event: in_flight"
        second = httpx.get(url, timeout=5)
    assert second.status_code == 429
    assert second.json()["error"]["code"] == "too_many_viewers"
