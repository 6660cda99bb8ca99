"""This process's memory as the memory tests read it: the gateway, its fakes and the client
run in it, so what it grows by while a test's block runs is what the block cost."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

# what a hostile request or answer may make the process grow by at most
GROWTH_LIMIT = 64 << 20


def rss() -> int:
    """The resident size now, in bytes."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096


class PeakRss:
    """The resident size, sampled every few milliseconds while in the block."""

    def __init__(self) -> None:
        self.before = self.peak = 0
        self._done = threading.Event()

    def __enter__(self) -> PeakRss:
        self.before = self.peak = rss()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, rss())

    def __exit__(self, *_: Any) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss())

    @property
    def growth(self) -> int:
        return self.peak - self.before
