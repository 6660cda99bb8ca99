"""Each view of the page opens cleanly (no console error, no failed request, no error
status), shows what the API holds, shows the API's errors, and writes data as text."""

from __future__ import annotations

import openai
import pytest

from tests.browser.conftest import OpenPage
from tests.browser.scenes import converse
from tests.e2e.conftest import GatewayFactory, Upstreams

pytestmark = pytest.mark.browser

TASK = "fix-the-parser"
# a model name that is markup: the page must show it as text, and never run it
HOSTILE_MODEL = '<img src=x onerror="window.pwned=1">'


def test_every_view_opens_without_errors(
    upstreams: Upstreams, start_gateway: GatewayFactory, open_page: OpenPage
) -> None:
    gw = start_gateway(upstreams.profiles)
    converse(gw, upstreams.llama, TASK, turns=3)
    with pytest.raises(openai.NotFoundError):
        gw.client(task="typo").chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}]
        )
    calls = gw.calls()
    first = calls[0]["call_id"]

    live = open_page(gw.url, "#live")
    live.page.wait_for_selector("#live-servers li[data-model='local'] [data-state='ready']")
    assert live.page.is_visible("#in-flight-empty")
    live.assert_clean()

    picker = open_page(gw.url, "#task")
    picker.page.wait_for_selector(f"#task-list li[data-task='{TASK}']")
    assert picker.page.is_visible("#task-none")
    picker.assert_clean()

    timeline = open_page(gw.url, f"#task/{TASK}")
    page = timeline.page
    page.wait_for_selector("#task-charts svg.chart")
    assert page.locator("#task-charts svg[data-chart='tokens'] a.turn").count() == 3
    assert page.locator("#task-calls tbody tr").count() == 3
    assert page.text_content("#task-totals [data-total='Calls'] dd") == "3"
    # the first call is marked as such, not as a miss
    assert page.locator("g.first-call").count() == 1 and page.locator("g.miss").count() == 0
    timeline.assert_clean()

    table = open_page(gw.url, "#calls")
    page = table.page
    page.wait_for_selector(f"#calls-table tr[data-call-id='{first}']")
    assert page.locator("#calls-table tbody tr").count() == len(calls)
    failed = page.locator("#calls-table tbody tr[data-status='error']")
    assert failed.count() == 1 and "model_not_found" in (failed.text_content() or "")
    # a row opens its call's whole record
    page.click(f"#calls-table tr[data-call-id='{first}']")
    page.wait_for_selector("#call-detail [data-field='call_id']")
    assert page.url.endswith(f"#call/{first}")
    assert page.text_content("#call-detail [data-field='call_id'] dd") == first
    assert page.text_content("#call-detail [data-field='miss_cause'] dd") == "first_call"
    assert page.locator("#call-detail .attempts tr[data-attempt]").count() == 1
    table.assert_clean()

    record = open_page(gw.url, f"#call/{calls[1]['call_id']}")
    record.page.wait_for_selector("#call-detail [data-field='task']")
    assert record.page.text_content("#call-detail [data-field='task'] dd") == TASK
    record.assert_clean()

    models = open_page(gw.url, "#models")
    page = models.page
    page.wait_for_selector(".model-card[data-model='local'] .server[data-state='ready']")
    assert page.locator(".model-card").count() == len(upstreams.profiles)
    cloud = page.locator(".model-card[data-model='gpt']")
    assert "A cloud API" in (cloud.text_content() or "")
    assert cloud.locator("[data-capability='streaming']").count() == 1
    models.assert_clean()


def test_an_error_of_the_api_is_shown_in_the_page(
    upstreams: Upstreams, start_gateway: GatewayFactory, open_page: OpenPage
) -> None:
    gw = start_gateway(upstreams.profiles)
    watched = open_page(gw.url, "#calls?since=yesterday")
    error = watched.page.wait_for_selector("[data-view='calls'] .errors .error")
    assert error is not None
    text = error.text_content() or ""
    assert "'since' must be an ISO 8601 time" in text and "HTTP 400" in text
    assert [p for p in watched.problems if "HTTP 400" in p and "/ui/api/calls" in p]
    # a good filter clears it
    watched.page.evaluate("location.hash = '#calls?status=ok'")
    watched.page.wait_for_selector("[data-view='calls'] .errors .error", state="detached")


def test_data_is_written_as_text(
    upstreams: Upstreams, start_gateway: GatewayFactory, open_page: OpenPage
) -> None:
    gw = start_gateway(upstreams.profiles)
    with pytest.raises(openai.NotFoundError):
        gw.client(task="markup").chat.completions.create(
            model=HOSTILE_MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    watched = open_page(gw.url, "#calls")
    page = watched.page
    cell = page.wait_for_selector("#calls-table tbody tr td:nth-child(4)")
    assert cell is not None and cell.text_content() == HOSTILE_MODEL
    assert page.locator("#calls-table img").count() == 0
    assert page.evaluate("window.pwned") is None
    watched.assert_clean()
