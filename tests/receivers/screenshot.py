"""A PNG of Phoenix's page of one trace, as a person sees it: the tree of its spans and the
attributes of its first span, in Debian's Chromium (Playwright drives it and downloads no
browser of its own).

    python -m tests.receivers.screenshot UI_URL PROJECT TRACE_ID OUT.png
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from playwright.sync_api import Page, ViewportSize, sync_playwright

from tests.receivers.phoenix import project_id, read_spans

CHROMIUM = Path("/usr/bin/chromium")
VIEWPORT: ViewportSize = {"width": 1400, "height": 900}
# Each wait is bounded by this. The page is a React app that asks the GraphQL API for the
# trace after it loads: 2 s on an idle machine, 10 s beside a build.
WAIT_MS = 20_000


def trace_screenshot(ui_url: str, project: str, trace_id: str, path: Path) -> None:
    """Saves to ``path`` the UI's page of ``trace_id`` in ``project`` once it shows every
    span's name and a row of its first span's attributes; fails if it shows neither
    within the bound, rather than saving a spinner."""
    spans = read_spans(ui_url, project, trace_id)
    if not spans:
        raise AssertionError(f"Phoenix at {ui_url} has no trace {trace_id} in {project!r}")
    first = spans[0]
    url = (
        f"{ui_url}/projects/{quote(project_id(ui_url, project), safe='')}"
        f"/traces/{quote(trace_id, safe='')}?selectedSpanNodeId={quote(first['phoenix_id'])}"
    )
    if not CHROMIUM.exists():
        raise AssertionError(f"no Chromium at {CHROMIUM}: run `apt-get install -y chromium`")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(WAIT_MS)
            page.set_default_navigation_timeout(WAIT_MS)
            page.goto(url, wait_until="domcontentloaded")
            _show_trace(page, spans, first)
            path.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(path), animations="disabled")
        finally:
            browser.close()


def _show_trace(page: Page, spans: list[dict[str, Any]], first: dict[str, Any]) -> None:
    for name in dict.fromkeys(span["name"] for span in spans):
        page.get_by_text(name, exact=True).first.wait_for(state="visible")
    # the span's Info tab folds its attributes away; their tab lists them as a table
    page.get_by_role("tab", name="Attributes", exact=True).click()
    # the table shows an array's items as KEY.0, KEY.1...: a scalar's key is its own row
    key = next(
        (key for key, value in first["attributes"].items() if not isinstance(value, list)),
        None,
    )
    if key is not None:
        page.locator("td").get_by_text(key, exact=True).first.wait_for(state="visible")


def main(argv: list[str]) -> None:
    ui_url, project, trace_id, out = argv
    trace_screenshot(ui_url, project, trace_id, Path(out))


if __name__ == "__main__":
    main(sys.argv[1:])
