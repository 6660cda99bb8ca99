"""The gateway's own work is not shown as a caller's failure: a cache repair that gave way
to the next call reads "repair abandoned", muted, where a failed call is red."""

from __future__ import annotations

import openai
import pytest

from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.metering.meter import Meter
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE
from tests.browser.conftest import OpenPage
from tests.browser.scenes import converse
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams

pytestmark = pytest.mark.browser

TASK = "tidy-the-docs"


def abandoned_repair(gw: Gateway, legacy: bool = False) -> str:
    """A repair's record as the cache keeper submits it when a call arrives (``legacy``:
    as releases before the ``abandoned`` status wrote it: an error with that code)."""
    meter = Meter(gw.app.bus, CallContext.new(TASK, REPAIR_PURPOSE), "local")
    meter.record.provider = "local"
    if not legacy:
        meter.abandoned()
        return meter.record.call_id
    record = meter.record
    record.status, record.http_status, record.error_code = "error", 499, "abandoned"
    gw.app.bus.publish(record)
    return record.call_id


def test_an_abandoned_repair_is_muted_and_a_failure_is_red(
    upstreams: Upstreams, start_gateway: GatewayFactory, open_page: OpenPage
) -> None:
    gw = start_gateway(upstreams.profiles)
    converse(gw, upstreams.llama, TASK, turns=1)
    repair = abandoned_repair(gw)
    legacy = abandoned_repair(gw, legacy=True)
    with pytest.raises(openai.NotFoundError):
        gw.client(task=TASK).chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}]
        )
    assert gw.app.bus.flush(10.0)

    table = open_page(gw.url, "#calls")
    page = table.page
    for call_id in (repair, legacy):
        row = page.locator(f"#calls-table tr[data-call-id='{call_id}']")
        row.wait_for()
        assert row.locator(".badge-abandoned").text_content() == "repair abandoned"
        assert row.locator(".badge-error").count() == 0
        # neither the 499 nor the code beside it: the badge says what happened
        assert "499" not in (row.text_content() or "")
        assert row.locator("td.code").text_content() == ""
    bad = page.locator("#calls-table tbody tr", has=page.locator(".badge-error"))
    assert bad.count() == 1 and "model_not_found" in (bad.text_content() or "")
    # the filter finds what is abandoned
    page.select_option("#call-filters select[name='status']", "abandoned")
    page.click("#call-filters button[type='submit']")
    page.wait_for_function("() => document.querySelectorAll('#calls-table tbody tr').length === 1")
    table.assert_clean()

    timeline = open_page(gw.url, f"#task/{TASK}")
    page = timeline.page
    page.wait_for_selector("#task-charts svg.chart")
    repairs = page.locator("#task-charts svg[data-chart='tokens'] a.turn.repair")
    assert repairs.count() == 2
    assert page.locator("#task-charts a.turn.repair.failed").count() == 0
    assert page.locator("#task-charts a.turn.repair .fail-mark").count() == 0
    timeline.assert_clean()
