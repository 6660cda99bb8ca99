"""A screenshot of each view, wide and narrow, kept as the run's artefacts; the narrow
window never scrolls sideways (its tables and charts scroll within themselves)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from playwright.sync_api import Page

from tests.browser.conftest import NARROW, WIDE, OpenPage, artifacts
from tests.browser.scenes import SlowStream, run_workload
from tests.e2e.conftest import GatewayFactory, Upstreams
from tests.fakes.llama_server_process import write_binary

pytestmark = pytest.mark.browser

# each view, and what shows that it has drawn its data
VIEWS = {
    "live": ("#live", "#in-flight .card[data-phase='reading']"),
    "task-timeline": ("#task/bench-condensed", "#task-charts g.miss"),
    "calls": ("#calls", "#calls-table tbody tr[data-status='error']"),
    "models": ("#models", ".model-card[data-model='managed'] .server[data-state='ready']"),
}


def shoot(page: Page, name: str) -> Path:
    path = artifacts() / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def test_a_screenshot_of_each_view(
    upstreams: Upstreams, start_gateway: GatewayFactory, open_page: OpenPage, tmp_path: Path
) -> None:
    upstreams.llama.n_ctx = 65536
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    profiles = {
        **upstreams.profiles,
        "managed": {"provider": "local", "model_path": str(model)},
    }
    gw = start_gateway(profiles, llama_server_bin=str(write_binary(tmp_path)))
    task = run_workload(gw, "condensed")
    with pytest.raises(openai.NotFoundError):
        gw.client(task=task).chat.completions.create(
            model="gpt-6", messages=[{"role": "user", "content": "hi"}]
        )

    written: list[Path] = []
    for viewport, prefix in ((WIDE, ""), (NARROW, "narrow-")):
        for name, (view, drawn) in VIEWS.items():
            watched = open_page(gw.url, view, viewport=viewport)
            page = watched.page
            # a call in flight on Live, begun once the page listens
            stream = SlowStream(gw, upstreams.llama, delay_ms=40) if name == "live" else None
            page.wait_for_selector(drawn)
            if name == "live":
                page.wait_for_selector("#in-flight .card .bar[data-progress]")
            written.append(shoot(page, prefix + name))
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= viewport["width"], f"{prefix}{name}: {width} px wide"
            if stream is not None:
                stream.join()
            if name == "calls":
                page.click("#calls-table tbody tr")
                page.wait_for_selector("#call-detail [data-field='call_id']")
                written.append(shoot(page, prefix + "call"))
                width = page.evaluate("document.documentElement.scrollWidth")
                assert width <= viewport["width"], f"{prefix}call: {width} px wide"
            watched.assert_clean()
    print(f"screenshots of the page of calls: {artifacts()}")
    assert all(p.stat().st_size > 10_000 for p in written)
