"""The calls of the clients people use reach the page of calls as they happen: the
``openai`` SDK's stream helper and LiteLLM's streamed completion (OpenHands' client),
each told to the event stream from start to end, prompt progress included, and listed
under its task."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import httpx

from tests.e2e.conftest import Gateway, Upstreams
from tests.e2e.test_ui_api import read_events
from tests.fakes.common import Reply

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
import litellm

LONG: list[Any] = [{"role": "user", "content": "word " * 300}]


def watched(gateway: Gateway, run: Any) -> list[tuple[str, Any]]:
    """The page's events while ``run`` makes its call, until the call's end is told."""
    events: list[tuple[str, Any]] = []
    stop = threading.Event()
    reader = threading.Thread(
        target=read_events, args=(gateway.url + "/ui/api/events", events, stop), daemon=True
    )
    reader.start()
    deadline = time.monotonic() + 5
    while not events:
        assert time.monotonic() < deadline, "the page's event stream never opened"
        time.sleep(0.01)
    run()
    deadline = time.monotonic() + 5
    while not any(kind == "finished" for kind, _ in events):
        assert time.monotonic() < deadline, "the call's end never reached the page"
        time.sleep(0.01)
    stop.set()
    return events


def assert_followed(events: list[tuple[str, Any]], task: str) -> str:
    (started,) = [d for k, d in events if k == "started"]
    assert started["task"] == task and started["stream"] is True
    call_id = started["call_id"]
    progress = [d for k, d in events if k == "progress" and d["call_id"] == call_id]
    assert len({p["processed"] for p in progress}) >= 2
    assert [k for k, d in events if k == "first_token" and d["call_id"] == call_id]
    (finished,) = [d for k, d in events if k == "finished"]
    assert finished["call_id"] == call_id and finished["status"] == "ok"
    return str(call_id)


def listed(gateway: Gateway, task: str) -> list[str]:
    gateway.calls()  # written
    with httpx.Client(base_url=gateway.url, timeout=10) as http:
        calls = http.get("/ui/api/calls", params={"task": task}).json()["calls"]
    return [c["call_id"] for c in calls]


def test_the_openai_sdks_stream_helper_is_followed(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.llama.progress_batch = 64
    upstreams.llama.queue(Reply(content="one two three", chunk_delay_ms=10))
    client = gateway.client(task="sdk-helper")

    def run() -> None:
        with client.chat.completions.stream(model="local", messages=LONG) as s:
            assert s.get_final_completion().choices[0].message.content == "one two three"

    call_id = assert_followed(watched(gateway, run), "sdk-helper")
    assert listed(gateway, "sdk-helper") == [call_id]


def test_litellms_stream_is_followed(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.llama.progress_batch = 64
    upstreams.llama.queue(Reply(content="four five six", chunk_delay_ms=10))

    def run() -> None:
        chunks = litellm.completion(
            model="openai/local",
            api_base=gateway.url + "/v1",
            api_key="unused",
            messages=LONG,
            stream=True,
            num_retries=0,
            extra_headers={"X-BoundedCode-Task": "litellm-task"},
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "four five six"

    call_id = assert_followed(watched(gateway, run), "litellm-task")
    assert listed(gateway, "litellm-task") == [call_id]
