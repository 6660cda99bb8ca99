"""A managed llama-server that dies is restarted; the call that failed is in the ledger."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.integration.conftest import MODEL, managed_pid, start_real_gateway

HELLO: list[Any] = [{"role": "user", "content": "Say hello."}]


def test_killed_server_is_restarted(tmp_path: Path) -> None:
    gw = start_real_gateway(
        tmp_path, {"solo": {"provider": "local", "model_path": MODEL, "server": {"ctx_size": 2048}}}
    )
    try:
        client = gw.client(task="restart")
        assert client.chat.completions.create(model="solo", messages=HELLO, max_tokens=4)
        old_pid = managed_pid(gw, "solo")
        os.kill(old_pid, signal.SIGKILL)
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="solo", messages=HELLO, max_tokens=4)
        assert info.value.status_code == 503
        deadline = time.monotonic() + 60
        while True:
            try:
                reply = client.chat.completions.create(model="solo", messages=HELLO, max_tokens=4)
                break
            except openai.APIStatusError as exc:
                assert exc.status_code == 503
                assert time.monotonic() < deadline, "the server was not restarted in time"
                time.sleep(0.2)
        assert reply.choices[0].message.content is not None
        assert managed_pid(gw, "solo") != old_pid
        calls = gw.calls()
        statuses = [c["http_status"] for c in calls]
        assert statuses[0] == 200 and statuses[1] == 503 and statuses[-1] == 200
        assert calls[1]["error_code"] == "upstream_unavailable"
        assert len(gw.ledger_rows()) == len(calls)
    finally:
        gw.stop()
    # stopping the gateway stopped its server
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(managed_pid(gw, "solo"), 0)
            time.sleep(0.1)
