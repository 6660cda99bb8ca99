"""With ``auth:``, the page is an admin's: the browser asks for the key (HTTP Basic, the
key as the password) and sends it with every request, the event stream's included."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import HttpCredentials

from boundedcode_gateway.access.keys import key_digest, new_key
from tests.browser.conftest import OpenPage
from tests.e2e.conftest import GatewayFactory, Upstreams

pytestmark = pytest.mark.browser

ADMIN_KEY = new_key()
CALLER_KEY = new_key()
AUTH = {
    "keys": [
        {"name": "agent", "sha256": key_digest(CALLER_KEY), "models": ["local"]},
        {"name": "admin", "sha256": key_digest(ADMIN_KEY), "models": ["*"], "admin": True},
    ],
}


def basic(key: str) -> HttpCredentials:
    return {"username": "admin", "password": key, "send": "always"}


def test_an_admin_key_opens_the_page_and_its_event_stream(
    upstreams: Upstreams, start_gateway: GatewayFactory, open_page: OpenPage
) -> None:
    gw = start_gateway(upstreams.profiles, auth=AUTH)
    gw.client(task="secured", api_key=CALLER_KEY).chat.completions.create(
        model="local", messages=[{"role": "user", "content": "hello"}]
    )
    (call,) = gw.calls()

    # what a browser is told before it has the key, and with a key that is not an admin's
    page = httpx.get(gw.url + "/ui/", timeout=5)
    assert page.status_code == 401 and page.headers["www-authenticate"].startswith("Basic ")
    other = httpx.get(gw.url + "/ui/api/calls", auth=("me", CALLER_KEY), timeout=5)
    assert other.status_code == 403 and other.json()["error"]["code"] == "admin_required"

    # open_page waits for the event stream to be live
    watched = open_page(gw.url, "#calls", credentials=basic(ADMIN_KEY))
    row = watched.page.wait_for_selector(f"#calls-table tr[data-call-id='{call['call_id']}']")
    assert row is not None and "secured" in (row.text_content() or "")
    watched.assert_clean()
