"""The Live view follows a call as it goes: the prompt read so far, then the answer
streaming, then the call gone from the calls in flight and into the Calls table."""

from __future__ import annotations

import re
import time

import pytest

from tests.browser.conftest import OpenPage
from tests.browser.scenes import SlowStream
from tests.e2e.conftest import GatewayFactory, Upstreams

pytestmark = pytest.mark.browser

READING = re.compile(r"^reading the conversation: [\d.]+k? of [\d.]+k? new tokens")
ANSWERING = re.compile(r"^TTFT [\d.]+ m?s · [\d.]+ tokens/s · \d+ chunks so far$")


def test_a_long_stream_shows_its_progress_then_lands_in_calls(
    upstreams: Upstreams, start_gateway: GatewayFactory, open_page: OpenPage
) -> None:
    gw = start_gateway(upstreams.profiles)
    watched = open_page(gw.url, "#live")
    page = watched.page
    stream = SlowStream(gw, upstreams.llama)  # 25 steps of reading, 40 chunks of answer

    card = page.wait_for_selector("#in-flight .card")
    assert card is not None
    call_id = card.get_attribute("data-call-id")
    assert call_id
    # the bar's value, read as the fake reads the prompt, until the answer starts
    seen: list[float] = []
    phrases: list[str] = []
    deadline = time.monotonic() + 10
    while card.get_attribute("data-phase") != "answering":
        assert time.monotonic() < deadline, f"no answer began; progress seen: {seen}"
        value = card.eval_on_selector(".bar", "bar => bar.dataset.progress || null")
        if value is not None and (not seen or float(value) != seen[-1]):
            seen.append(float(value))
            phrases.append(card.eval_on_selector(".phase", "p => p.textContent"))
        time.sleep(0.03)
    reading = [v for v in seen if v < 1]
    assert len(set(reading)) >= 2, f"the bar did not advance while reading: {seen}"
    assert seen == sorted(seen), f"the bar went back: {seen}"
    assert all(READING.match(p) for p in phrases[: len(reading)]), phrases
    assert "of 5.0k new tokens" in phrases[0]

    # the answer streams: its TTFT and speed
    page.wait_for_function(
        "() => /tokens\\/s/.test(document.querySelector('#in-flight .card .stats').textContent)"
    )
    stats = card.eval_on_selector(".stats", "p => p.textContent")
    assert ANSWERING.match(stats), stats
    elapsed = card.eval_on_selector(".elapsed", "e => e.textContent")
    assert re.match(r"^\d+(\.\d)? s$|^\d+ ms$", elapsed), elapsed

    # finished: out of the calls in flight, into "just finished", and into the Calls table
    # (opened before the call ends, so the row comes from the event stream)
    page.click("a[data-view-link='calls']")
    page.wait_for_selector("#calls-empty", state="visible")  # nothing recorded yet
    assert page.locator(f"#calls-table tr[data-call-id='{call_id}']").count() == 0
    stream.join()
    row = page.wait_for_selector(f"#calls-table tr[data-call-id='{call_id}']")
    assert row is not None and "long-read" in (row.text_content() or "")
    page.click("a[data-view-link='live']")
    page.wait_for_selector(f"#finished li[data-call-id='{call_id}']")
    assert page.locator("#in-flight .card").count() == 0
    assert page.text_content("#in-flight-count") == "0"
    watched.assert_clean()
