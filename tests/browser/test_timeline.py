"""A task's timeline marks each cache miss on its call and names its cause: the history
rewritten by a condensation, the reasoning a caller dropped."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page

from tests.browser.conftest import OpenPage
from tests.browser.scenes import converse, run_workload
from tests.e2e.conftest import GatewayFactory, Upstreams

pytestmark = pytest.mark.browser


def misses_shown(page: Page) -> list[tuple[str, str, str]]:
    """(call id, cause, label) of each miss marked on the token chart."""
    shown: list[list[str]] = page.eval_on_selector_all(
        "#task-charts g.miss",
        "gs => gs.map(g => [g.dataset.callId, g.dataset.missCause,"
        " g.querySelector('text').textContent])",
    )
    return [(c, m, t) for c, m, t in shown]


def open_timeline(open_page: OpenPage, url: str, task: str, calls: list[dict[str, Any]]) -> Page:
    watched = open_page(url, f"#task/{task}")
    page = watched.page
    page.wait_for_selector("#task-charts svg.chart")
    bars = page.eval_on_selector_all(
        "#task-charts svg[data-chart='tokens'] a.turn", "as => as.map(a => a.dataset.callId)"
    )
    # every call, oldest first
    assert bars == [c["call_id"] for c in calls]
    watched.assert_clean()
    return page


def test_a_condensed_task_shows_one_history_rewrite(
    upstreams: Upstreams, start_gateway: GatewayFactory, open_page: OpenPage
) -> None:
    upstreams.llama.n_ctx = 65536
    gw = start_gateway(upstreams.profiles)
    task = run_workload(gw, "condensed")
    calls = [c for c in gw.calls() if c["task"] == task]
    rewrites = [c for c in calls if c["miss_cause"] == "history_rewrite"]
    assert len(rewrites) == 1, [c["miss_cause"] for c in calls]
    at = rewrites[0]["miss_at"]["message"]

    page = open_timeline(open_page, gw.url, task, calls)
    assert misses_shown(page) == [
        (rewrites[0]["call_id"], "history_rewrite", f"history_rewrite at message {at}")
    ]
    assert page.locator("g.first-call").count() == 1
    # the turn's row says the same
    row = page.locator(f"#task-calls tr[data-call-id='{rewrites[0]['call_id']}']")
    assert row.locator("[data-miss-cause='history_rewrite']").text_content() == (
        f"history_rewrite at message {at}"
    )
    totals = page.text_content("#task-totals [data-total='Misses'] dd") or ""
    assert "history_rewrite 1" in totals


def test_dropped_reasoning_shows_its_misses(
    upstreams: Upstreams, start_gateway: GatewayFactory, open_page: OpenPage
) -> None:
    # the caller sends no reasoning back, and the gateway does not put it back either
    gw = start_gateway(upstreams.profiles, inference={"reasoning_history": "drop"})
    converse(gw, upstreams.llama, "thinking-task", turns=4)
    calls = gw.calls()
    assert [c["miss_cause"] for c in calls] == ["first_call"] + ["reasoning_dropped"] * 3

    page = open_timeline(open_page, gw.url, "thinking-task", calls)
    shown = misses_shown(page)
    assert [(c, m) for c, m, _ in shown] == [(c["call_id"], c["miss_cause"]) for c in calls[1:]]
    for (_, _, label), call in zip(shown, calls[1:], strict=True):
        assert label == f"reasoning_dropped at message {call['miss_at']['message']}"
    # each turn's purpose is drawn under its bar
    purposes = page.eval_on_selector_all(
        "#task-charts rect.purpose-strip", "rs => rs.map(r => r.dataset.purpose)"
    )
    assert purposes == ["agent_turn"] * 4


def test_slot_saves_restores_and_a_refused_file_are_marked_on_the_tasks_timeline(
    start_gateway: GatewayFactory, open_page: OpenPage, tmp_path: Any
) -> None:
    from tests.e2e.test_slot_files import Server, chat, store_files, turn
    from tests.fakes.server import stop_all

    server = Server(tmp_path / "slots")
    try:
        gw = start_gateway({"m": server.profile()})
        a, b = chat(task="a"), chat("Another agent. " * 80, "b")
        turn(gw, "a", a)
        turn(gw, "b", b)  # a's slot saved
        turn(gw, "a", a)  # restored
        turn(gw, "b", b)  # b's restored, a's saved again
        for saved in store_files(gw):
            saved.write_bytes(saved.read_bytes()[:10])  # cut: refused at a's next turn
        turn(gw, "a", a)
        calls = [c for c in gw.calls(repairs=True) if c["task"] == "a"]
        restored = next(c for c in calls if c.get("restored_tokens"))
        refused = next(c for c in calls if c.get("restore_failure"))
        page = open_timeline(open_page, gw.url, "a", calls)
        marks = page.eval_on_selector_all(
            "#task-charts svg[data-chart='tokens'] g.restored",
            "gs => gs.map(g => g.dataset.callId)",
        )
        assert marks == [restored["call_id"]]
        assert page.locator("#task-charts svg[data-chart='tokens'] g.slot-save").count() == 2
        assert (
            refused["call_id"],
            "restore_ineffective",
            "restore ineffective: file_refused: cut",
        ) in (misses_shown(page))
        page.screenshot(path=str(tmp_path / "timeline.png"), full_page=True)
    finally:
        stop_all([server.running])
