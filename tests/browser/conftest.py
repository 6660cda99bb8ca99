"""The page of calls in a real browser: Debian's Chromium driven by Playwright, against a
gateway and its fakes each in a thread (tests/e2e/conftest.py).

Playwright cannot download a browser here, so it launches the system's one; without it
the tests fail and say how to install it, rather than passing by being skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    HttpCredentials,
    Page,
    Request,
    Response,
    sync_playwright,
)

# the fixtures of the end-to-end suite: the fakes, and the gateway started on them
from tests.e2e.conftest import start_gateway, upstreams  # noqa: F401

CHROMIUM = Path("/usr/bin/chromium")
REPO_ROOT = Path(__file__).resolve().parents[2]
# screenshots of each view, kept after the run (git-ignored)
ARTIFACTS = REPO_ROOT / "test-artifacts" / "ui"
# every wait of a browser test is bounded: a few seconds, never Playwright's 30
WAIT_MS = 5000
WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 400, "height": 800}


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Chromium, headless; one per test (the sync API's loop lives no longer than it)."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"the browser tests need Chromium at {CHROMIUM}: run `apt-get install -y chromium` "
            "(`make test` installs it when it is missing)",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield chromium
        finally:
            chromium.close()


@dataclass
class Watched:
    """A page and everything that went wrong on it: console errors, uncaught exceptions,
    requests that failed and answers of 400 or more."""

    page: Page
    problems: list[str] = field(default_factory=list)
    # set once the test is done with the page: the event stream's request is cut when the
    # page closes, which is not a problem of the page
    closing: bool = False

    def assert_clean(self) -> None:
        assert self.problems == [], "\n".join(self.problems)


def watch(page: Page) -> Watched:
    watched = Watched(page)

    def console(msg: ConsoleMessage) -> None:
        if msg.type in ("error", "warning") and not watched.closing:
            watched.problems.append(f"console {msg.type}: {msg.text} ({msg.location})")

    def page_error(exc: Exception) -> None:
        watched.problems.append(f"uncaught: {exc}")

    def failed(request: Request) -> None:
        if not watched.closing:
            watched.problems.append(f"request failed: {request.url} ({request.failure})")

    def response(resp: Response) -> None:
        if resp.status >= 400:
            watched.problems.append(f"HTTP {resp.status}: {resp.url}")

    page.on("console", console)
    page.on("pageerror", page_error)
    page.on("requestfailed", failed)
    page.on("response", response)
    return watched


OpenPage = Callable[..., Watched]


@pytest.fixture
def open_page(browser: Browser) -> Iterator[OpenPage]:
    """Open the page of a gateway at a view: ``open_page(gateway_url, "#calls")``."""
    opened: list[Watched] = []

    def open_at(
        base_url: str,
        view: str = "",
        viewport: dict[str, int] | None = None,
        credentials: HttpCredentials | None = None,
    ) -> Watched:
        context = browser.new_context(
            viewport=viewport or WIDE,  # type: ignore[arg-type]
            http_credentials=credentials,
        )
        context.set_default_timeout(WAIT_MS)
        page = context.new_page()
        watched = watch(page)
        opened.append(watched)
        page.goto(f"{base_url}/ui/{view}")
        page.wait_for_selector("#stream-state[data-state='live']")
        return watched

    yield open_at
    for watched in opened:
        watched.closing = True
        watched.page.context.close()


_shots_taken = False


def artifacts() -> Path:
    """The folder of the screenshots, named at the end of the run."""
    global _shots_taken
    _shots_taken = True
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _shots_taken:
        terminalreporter.write_line(f"screenshots of the page of calls: {ARTIFACTS}")


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
