"""The Limits view: each budget's spent, held and left, each rate window's use and each
concurrency limit's places, while a call holds them and once it has ended."""

from __future__ import annotations

import threading

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import OpenPage
from tests.e2e.conftest import GatewayFactory, Upstreams
from tests.e2e.test_budgets import key, post
from tests.fakes.common import Reply

pytestmark = pytest.mark.browser

CI = {
    **key("ci", {"max_tokens": 1_000_000}),
    "rate_limits": {"requests": {"limit": 10}, "in_flight": 1},
}
ADMIN = {**key("ops"), "admin": True}


def test_the_limits_view_follows_a_call_that_holds_a_budget_a_window_and_a_place(
    upstreams: Upstreams, start_gateway: GatewayFactory, open_page: OpenPage
) -> None:
    gw = start_gateway(upstreams.profiles, auth={"keys": [CI, ADMIN]})
    watched = open_page(gw.url, "#limits", credentials={"username": "ops", "password": "ops"})
    page = watched.page
    page.wait_for_selector("#limits-budgets tbody tr[data-name='ci']")
    assert page.text_content("#limits-budgets tbody tr[data-name='ci'] td:nth-child(6)") == "0"
    upstreams.openai.queue(Reply(content="slow", delay_ms=4000))
    call = threading.Thread(target=post, args=(gw, "ci"), kwargs={"max_tokens": 100})
    call.start()
    # polled every 2 s: the call holds its place, its reservation and a request
    page.wait_for_selector("#limits-in-flight tbody tr[data-name='ci'] >> text=1")
    row = "#limits-budgets tbody tr[data-name='ci']"
    expect(page.locator(f"{row} td:nth-child(6)")).not_to_have_text("0")
    window = "#limits-windows tbody tr[data-name='ci'][data-metric='requests']"
    assert page.text_content(f"{window} td:nth-child(4)") == "1"
    call.join(30)
    expect(page.locator(f"{row} td:nth-child(6)")).to_have_text("0", timeout=10_000)
    assert page.is_hidden("#limits-windows-empty")
    watched.assert_clean()
