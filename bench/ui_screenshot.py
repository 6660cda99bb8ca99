"""A picture of the page of calls over what a gateway recorded: serves ``--data-dir``'s
call log and ledger on a free loopback port (with a model profile that is never called)
and saves one view, as Chromium draws it in a window 1280 px wide, to ``--out``.

The README's task timeline of the inference benchmark's ``condensed`` workload:

    make bench-inference BENCH_ARGS="--workloads condensed --modes gateway-auto --out /tmp/c"
    .venv/bin/python -m bench.ui_screenshot --data-dir /tmp/c/runs/condensed/gateway-auto/gateway \\
        --view '#task/bench-condensed' --out docs/images/ui-task-timeline-condensed.png
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from bench.overhead import procs

CHROMIUM = "/usr/bin/chromium"
STARTUP_TIMEOUT_S = 30.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ui_screenshot")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--view", default="#live", help="the page's address after /ui/")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--wait-for", default="svg", help="a CSS selector drawn once loaded")
    parser.add_argument("--height", type=int, default=1040, help="the window's, in px")
    parser.add_argument("--full-page", action="store_true", help="the whole page, not the window")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ui-shot-") as tmp:
        config = Path(tmp) / "gateway.yaml"
        # a profile is required; this one points at a closed port and is never called
        config.write_text(
            f"data_dir: {args.data_dir.resolve()}\n"
            "models:\n  local:\n    provider: local\n    external_url: http://127.0.0.1:9\n"
        )
        port = procs.free_port()
        argv_ = [sys.executable, "-m", "boundedcode_gateway", "serve", "--config", str(config)]
        gateway = procs.start("gateway", [*argv_, "--port", str(port)], None, Path(tmp))
        try:
            procs.wait_listening(gateway, port, STARTUP_TIMEOUT_S)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM)
                page = browser.new_page(viewport={"width": 1280, "height": args.height})
                page.goto(f"http://127.0.0.1:{port}/ui/{args.view}")
                page.wait_for_selector(args.wait_for, timeout=10_000)
                page.wait_for_timeout(500)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.out), full_page=args.full_page)
                browser.close()
        finally:
            procs.stop(gateway)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
