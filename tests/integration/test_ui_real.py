"""The page of calls on the real server: the prompt progress llama-server reports reaches
the event stream for a caller that did not ask for it, and the models view shows the
managed server as it runs."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from tests.e2e.conftest import Gateway
from tests.e2e.test_ui_api import read_events


def test_the_real_servers_prompt_progress_reaches_the_page(real: Gateway) -> None:
    events: list[tuple[str, Any]] = []
    stop = threading.Event()
    reader = threading.Thread(
        target=read_events, args=(real.url + "/ui/api/events", events, stop), daemon=True
    )
    reader.start()
    deadline = time.monotonic() + 10
    while not events and time.monotonic() < deadline:
        time.sleep(0.01)
    # a prompt of a few thousand tokens: the server reads it in several batches
    long_user = [{"role": "user", "content": "Summarise: " + "the quick brown fox " * 500}]
    body = {"model": "smol", "messages": long_user, "max_tokens": 8, "stream": True}
    headers = {"X-BoundedCode-Task": "ui-real"}
    answer = httpx.post(real.url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert answer.status_code == 200 and b"prompt_progress" not in answer.content
    deadline = time.monotonic() + 10
    while not any(k == "finished" and d["task"] == "ui-real" for k, d in events):
        assert time.monotonic() < deadline, "the call's end never reached the page"
        time.sleep(0.01)
    stop.set()
    (started,) = [d for k, d in events if k == "started" and d["task"] == "ui-real"]
    call_id = started["call_id"]
    progress = [d for k, d in events if k == "progress" and d["call_id"] == call_id]
    assert len({p["processed"] for p in progress}) >= 2, progress
    assert progress[-1]["processed"] == progress[-1]["total"]
    (finished,) = [d for k, d in events if k == "finished" and d["call_id"] == call_id]
    assert finished["prompt_tokens"] == progress[-1]["total"]
    assert finished["evaluated_tokens"] == progress[-1]["total"] - progress[-1]["cache"]

    models = {
        m["name"]: m for m in httpx.get(real.url + "/ui/api/models", timeout=30).json()["models"]
    }
    (server,) = models["smol"]["servers"]
    assert server["state"] == "ready" and server["managed"] is True
    assert server["slots"]["total"] == 1 and server["slots"]["slots"][0]["n_ctx"] == 8192
