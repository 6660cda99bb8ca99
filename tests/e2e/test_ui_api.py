"""The page of calls' data: its endpoints over a real gateway and fake upstreams, their
filters and pages, an empty ledger and failed calls, the event stream of a streamed call,
and who may read any of it."""

from __future__ import annotations

import base64
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from boundedcode_gateway.access.keys import key_digest, new_key
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply
from tests.fakes.llama_server_process import write_binary

HELLO: list[Any] = [{"role": "user", "content": "hello there"}]
ADMIN_KEY = new_key()
USER_KEY = new_key()
AUTH = {
    "keys": [
        {"name": "user", "sha256": key_digest(USER_KEY), "models": ["*"]},
        {"name": "admin", "sha256": key_digest(ADMIN_KEY), "models": ["*"], "admin": True},
    ]
}


@pytest.fixture(params=["sqlite", "postgresql"])
def gateway(
    request: pytest.FixtureRequest, upstreams: Upstreams, start_gateway: GatewayFactory
) -> Gateway:
    """The suite's gateway, its ledger in SQLite or in PostgreSQL (the page asks either)."""
    if request.param == "sqlite":
        return start_gateway(upstreams.profiles)
    pg = request.getfixturevalue("pg")
    return start_gateway(upstreams.profiles, ledger=pg.url)


@pytest.fixture
def http(gateway: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        yield client


def call(
    http: httpx.Client,
    task: str,
    model: str = "local",
    purpose: str | None = None,
    stream: bool = False,
    messages: list[Any] = HELLO,
) -> httpx.Response:
    headers = {"X-BoundedCode-Task": task}
    if purpose:
        headers["X-BoundedCode-Purpose"] = purpose
    body = {"model": model, "messages": messages, "max_tokens": 20, "stream": stream}
    return http.post("/v1/chat/completions", json=body, headers=headers)


def get(http: httpx.Client, path: str, **params: Any) -> Any:
    resp = http.get(path, params=params)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_an_empty_ledger_answers_empty_lists(gateway: Gateway, http: httpx.Client) -> None:
    assert get(http, "/ui/api/calls") == {"calls": [], "next": None, "metering": True}
    assert get(http, "/ui/api/tasks") == {"tasks": [], "metering": True}


def test_calls_filtered_and_paged_newest_first(
    gateway: Gateway, upstreams: Upstreams, http: httpx.Client
) -> None:
    for i in range(5):
        assert call(http, "task-a", purpose="agent_turn" if i % 2 else "summary").status_code == 200
    upstreams.llama.queue(Reply(status=400))
    assert call(http, "task-b").status_code == 400
    assert call(http, "task-b", model="no-such-model").status_code == 404
    gateway.calls()  # written

    everything = get(http, "/ui/api/calls")["calls"]
    assert len(everything) == 7
    started = [c["started_at"] for c in everything]
    assert started == sorted(started, reverse=True)

    failed = get(http, "/ui/api/calls", status="error")["calls"]
    assert [c["task"] for c in failed] == ["task-b", "task-b"]
    assert failed[0]["error_code"] == "model_not_found" and failed[1]["http_status"] == 400
    assert all(c["status"] == "error" for c in failed)
    assert [
        c["model_profile"] for c in get(http, "/ui/api/calls", model="no-such-model")["calls"]
    ] == ["no-such-model"]
    turns = get(http, "/ui/api/calls", task="task-a", purpose="agent_turn")["calls"]
    assert len(turns) == 2 and all(c["purpose"] == "agent_turn" for c in turns)

    # pages of two, each after the last one's cursor: every call once, in order
    seen: list[str] = []
    page = get(http, "/ui/api/calls", limit=2)
    while True:
        seen += [c["call_id"] for c in page["calls"]]
        if page["next"] is None:
            break
        assert len(page["calls"]) == 2
        page = get(http, "/ui/api/calls", limit=2, before=page["next"])
    assert seen == [c["call_id"] for c in everything]

    newest = everything[0]["started_at"]
    assert [c["call_id"] for c in get(http, "/ui/api/calls", since=newest)["calls"]] == [
        everything[0]["call_id"]
    ]


def test_a_tasks_calls_carry_the_call_logs_detail(
    gateway: Gateway, upstreams: Upstreams, http: httpx.Client
) -> None:
    upstreams.llama.queue(Reply(status=500), Reply(content="second time lucky"))
    assert call(http, "retried").status_code == 200
    gateway.calls()
    row = get(http, "/ui/api/calls", task="retried")["calls"][0]
    assert [a["status"] for a in row["attempt_log"]] == [500, 200]
    assert "adjustments" in row and "miss_at" in row
    # the list across tasks is the ledger's rows alone
    assert "attempt_log" not in get(http, "/ui/api/calls")["calls"][0]

    whole = get(http, f"/ui/api/calls/{row['call_id']}")
    assert whole["attempt_log"] == row["attempt_log"] and whole["attempts"] == 2
    missing = http.get("/ui/api/calls/call_0000")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_a_record_older_than_memory_is_read_from_the_call_log(
    gateway: Gateway, upstreams: Upstreams, http: httpx.Client
) -> None:
    assert call(http, "old").status_code == 200
    record = gateway.calls()[0]
    gateway.app.router.ui._records._records.clear()  # type: ignore[union-attr]
    whole = get(http, f"/ui/api/calls/{record['call_id']}")
    assert whole == record
    row = get(http, "/ui/api/calls", task="old")["calls"][0]
    assert row["attempt_log"] == record["attempt_log"]


def test_tasks_sum_their_calls_and_count_misses_by_cause(
    gateway: Gateway, upstreams: Upstreams, http: httpx.Client
) -> None:
    history = list(HELLO)
    for turn in range(3):
        resp = call(http, "agent", messages=history)
        assert resp.status_code == 200
        history = [
            *history,
            resp.json()["choices"][0]["message"],
            {"role": "user", "content": f"and {turn}"},
        ]
    # the history rewritten: the first message replaced by a summary
    rewritten = [{"role": "user", "content": "summary of what happened"}, *history[1:]]
    assert call(http, "agent", messages=rewritten).status_code == 200
    upstreams.llama.queue(Reply(status=400))
    call(http, "agent", messages=rewritten)
    rows = gateway.calls()

    (task,) = get(http, "/ui/api/tasks")["tasks"]
    assert task["task"] == "agent" and task["calls"] == 5 and task["errors"] == 1
    assert task["prompt_tokens"] == sum(r["prompt_tokens"] or 0 for r in rows)
    assert task["cached_tokens"] == sum(r["cached_tokens"] or 0 for r in rows)
    assert task["evaluated_tokens"] == sum(r["evaluated_tokens"] or 0 for r in rows)
    assert task["hit_ratio"] == pytest.approx(task["cached_tokens"] / task["prompt_tokens"])
    causes = [r["miss_cause"] for r in rows if r["miss_cause"] not in (None, "none")]
    assert "history_rewrite" in causes
    assert task["misses"] == {c: causes.count(c) for c in set(causes)}
    assert (
        task["first_call"] == rows[0]["started_at"] and task["last_call"] == rows[-1]["started_at"]
    )

    assert get(http, "/ui/api/tasks", q="gen")["tasks"][0]["task"] == "agent"
    assert get(http, "/ui/api/tasks", q="%")["tasks"] == []  # a wildcard is a character


def test_a_tasks_token_counts_are_not_its_turns(gateway: Gateway, http: httpx.Client) -> None:
    assert call(http, "counted").status_code == 200
    ask = {"model": "local", "messages": [{"role": "user", "content": "how long is this?"}]}
    for _ in range(2):
        counted = http.post(
            "/v1/messages/count_tokens",
            json=ask,
            headers={"X-BoundedCode-Task": "counted", "anthropic-version": "2023-06-01"},
        )
        assert counted.status_code == 200, counted.text
    assert call(http, "counted").status_code == 200
    purposes = [r["purpose"] for r in gateway.calls()]
    assert sorted(purposes) == ["agent_turn", "agent_turn", "token_count", "token_count"]

    (task,) = get(http, "/ui/api/tasks")["tasks"]
    # the gateway's own records: neither a turn nor a repair
    assert (task["calls"], task["errors"], task["repairs"]) == (2, 0, 0)
    assert task["repair_evaluated_tokens"] is None


def test_models_show_each_profile_and_its_servers(gateway: Gateway, http: httpx.Client) -> None:
    models = {m["name"]: m for m in get(http, "/ui/api/models")["models"]}
    assert set(models) == {"local", "other", "gpt", "glm"}
    (server,) = models["local"]["servers"]
    assert server["managed"] is False and server["state"] == "ready"
    assert server["slots"]["total"] == 1 and server["slots"]["busy"] == 0
    assert models["local"]["capabilities"]["prompt_progress"] is True
    assert models["gpt"]["servers"] == [] and models["gpt"]["provider"] == "openai"


def test_slots_are_shown_as_counts_never_as_prompts(
    gateway: Gateway, upstreams: Upstreams, http: httpx.Client
) -> None:
    secret_words = "the words of a private conversation"
    assert call(http, "t", messages=[{"role": "user", "content": secret_words}]).status_code == 200
    raw = http.get("/ui/api/models").text
    assert "private conversation" not in raw
    models = {m["name"]: m for m in orjson.loads(raw)["models"]}
    slot = models["local"]["servers"][0]["slots"]["slots"][0]
    assert set(slot) == {"id", "busy", "n_ctx", "cached_tokens"} and slot["cached_tokens"] > 0


def test_a_local_server_that_is_down_is_shown_down(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway({"gone": {"provider": "local", "external_url": "http://127.0.0.1:9"}})
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        (model,) = get(http, "/ui/api/models")["models"]
    (server,) = model["servers"]
    assert server["state"] == "down" and server["slots"] is None and server["reason"]


def read_events(url: str, into: list[tuple[str, Any]], stop: threading.Event) -> None:
    with httpx.Client(timeout=30) as client, client.stream("GET", url) as resp:
        assert resp.headers["content-type"] == "text/event-stream"
        kind = ""
        for line in resp.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: ") :]
            elif line.startswith("data: "):
                into.append((kind, orjson.loads(line[len("data: ") :])))
            if stop.is_set():
                return


def test_the_event_stream_follows_a_streamed_call(
    gateway: Gateway, upstreams: Upstreams, http: httpx.Client
) -> None:
    upstreams.llama.progress_batch = 16
    upstreams.llama.queue(Reply(content="one two three four five six", chunk_delay_ms=20))
    events: list[tuple[str, Any]] = []
    stop = threading.Event()
    reader = threading.Thread(
        target=read_events, args=(gateway.url + "/ui/api/events", events, stop), daemon=True
    )
    reader.start()
    deadline = time.monotonic() + 5
    while not events and time.monotonic() < deadline:
        time.sleep(0.01)
    assert events[0] == ("in_flight", {"calls": []})

    long_prompt = [{"role": "user", "content": "word " * 200}]
    resp = call(http, "watched", purpose="agent_turn", stream=True, messages=long_prompt)
    assert resp.status_code == 200
    deadline = time.monotonic() + 5
    while not any(k == "finished" for k, _ in events) and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    kinds = [k for k, _ in events]
    (started,) = [d for k, d in events if k == "started"]
    assert started["task"] == "watched" and started["purpose"] == "agent_turn"
    assert started["model"] == "local" and started["stream"] is True
    call_id = started["call_id"]
    progress = [d for k, d in events if k == "progress"]
    assert len({p["processed"] for p in progress}) >= 2
    assert all(p["call_id"] == call_id and p["total"] >= p["processed"] for p in progress)
    assert progress[-1]["processed"] == progress[-1]["total"]
    (first,) = [d for k, d in events if k == "first_token"]
    (finished,) = [d for k, d in events if k == "finished"]
    assert finished["call_id"] == call_id and finished["status"] == "ok"
    assert finished["ttft_ms"] == first["ttft_ms"]
    assert kinds.index("started") < kinds.index("progress") < kinds.index("first_token")
    assert kinds.index("first_token") < kinds.index("finished")
    assert gateway.app.events.in_flight == []


def test_a_viewer_that_connects_mid_call_is_shown_it_in_flight(
    gateway: Gateway, upstreams: Upstreams, http: httpx.Client
) -> None:
    upstreams.llama.queue(Reply(content="slow " * 20, chunk_delay_ms=50))
    done = threading.Event()

    def slow_call() -> None:
        with httpx.Client(base_url=gateway.url, timeout=30) as own:
            call(own, "long", stream=True)
        done.set()

    threading.Thread(target=slow_call, daemon=True).start()
    deadline = time.monotonic() + 5
    while not gateway.app.events.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    events: list[tuple[str, Any]] = []
    stop = threading.Event()
    threading.Thread(
        target=read_events, args=(gateway.url + "/ui/api/events", events, stop), daemon=True
    ).start()
    deadline = time.monotonic() + 5
    while not events and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    kind, data = events[0]
    assert kind == "in_flight" and [c["task"] for c in data["calls"]] == ["long"]
    assert done.wait(10)


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"status": "maybe"}, "status"),
        ({"since": "yesterday"}, "since"),
        ({"before": "nonsense"}, "before"),
        ({"tsak": "x"}, "tsak"),
    ],
)
def test_bad_parameters_are_a_400_naming_them(
    http: httpx.Client, params: dict[str, str], param: str
) -> None:
    resp = http.get("/ui/api/calls", params=params)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == param


def test_only_get_and_known_paths(http: httpx.Client) -> None:
    assert http.post("/ui/api/calls").status_code == 405
    assert http.get("/ui/api/nothing").status_code == 404
    assert http.get("/ui/nothing.js").status_code == 404
    moved = http.get("/ui", follow_redirects=False)
    assert moved.status_code == 308 and moved.headers["location"] == "/ui/"
    page = http.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]


def test_ui_false_hides_it(upstreams: Upstreams, start_gateway: GatewayFactory) -> None:
    gw = start_gateway(upstreams.profiles, ui=False)
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        for path in ("/ui/", "/ui/api/calls", "/ui/api/events"):
            assert http.get(path).status_code == 404


def basic(key: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"me:{key}".encode()).decode()}


def test_with_auth_only_an_admin_key_opens_it(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(upstreams.profiles, auth=AUTH)
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        asked = http.get("/ui/")
        assert asked.status_code == 401
        assert asked.headers["www-authenticate"].startswith("Basic realm=")
        assert http.get("/ui/", headers=basic("wrong-key")).status_code == 401
        refused = http.get("/ui/api/calls", headers=basic(USER_KEY))
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_required"
        assert http.get("/ui/", headers=basic(ADMIN_KEY)).status_code == 200
        bearer = {"Authorization": f"Bearer {ADMIN_KEY}"}
        assert http.get("/ui/api/calls", headers=bearer).status_code == 200
        # Basic stays the page's: the API still asks for a Bearer key
        assert http.get("/v1/models", headers=basic(ADMIN_KEY)).status_code == 401


def test_a_managed_servers_state_follows_its_process(
    tmp_path: Path, start_gateway: GatewayFactory
) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    profile = {"provider": "local", "model_path": str(model), "server": {"cache_repair": False}}
    gw = start_gateway({"managed": profile}, llama_server_bin=str(write_binary(tmp_path)))

    def server() -> dict[str, Any]:
        with httpx.Client(base_url=gw.url, timeout=10) as http:
            (model,) = get(http, "/ui/api/models")["models"]
        (shown,) = model["servers"]
        return dict(shown)

    def wait_for(state: str) -> dict[str, Any]:
        deadline = time.monotonic() + 20
        while (shown := server())["state"] != state:
            assert time.monotonic() < deadline, f"never {state}: {shown}"
            time.sleep(0.05)
        return shown

    ready = wait_for("ready")
    assert ready["managed"] is True and ready["restarts"] == 0 and ready["uptime_s"] >= 0
    assert ready["argv"][0].endswith("fake-llama-server") and "--port" in ready["argv"]
    # the slot count llama-server would choose, fixed by the gateway (its calls are pinned)
    assert ready["slots"]["total"] == 4
    os.kill(ready["pid"], signal.SIGKILL)
    gone = wait_for("restarting")
    assert gone["uptime_s"] is None and gone["slots"] is None
    back = wait_for("ready")
    assert back["restarts"] == 1 and back["pid"] != ready["pid"]


def test_a_managed_servers_flags_are_shown_without_its_tokens(
    tmp_path: Path, start_gateway: GatewayFactory
) -> None:
    """A token given to the server on its command line (``-hft`` for a private ``-hf``
    model) is not on the page, nor anywhere the gateway answers with the server."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    token = "hf_" + new_key()[4:]
    extra = ["-hft", token, f"--hf-token={token}", f"--mmproj-url=https://{token}@hf.example/p"]
    profile = {
        "provider": "local",
        "model_path": str(model),
        "server": {"cache_repair": False, "extra_args": extra},
    }
    gw = start_gateway({"managed": profile}, llama_server_bin=str(write_binary(tmp_path)))
    deadline = time.monotonic() + 20
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        while True:
            page = http.get("/ui/api/models")
            (shown,) = page.json()["models"][0]["servers"]
            if shown["state"] == "ready":
                break
            assert time.monotonic() < deadline, shown
            time.sleep(0.05)
        retrieved = http.get("/v1/models/managed")
    argv = shown["argv"]
    assert argv[argv.index("-hft") + 1] == "***" and "--hf-token=***" in argv
    assert "--mmproj-url=https://***@hf.example/p" in argv
    assert token not in page.text and token not in retrieved.text
    assert retrieved.json()["servers"] == [{"name": "managed", "state": "ready"}]


def test_a_managed_server_that_never_starts_is_shown_failed(
    tmp_path: Path, start_gateway: GatewayFactory
) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    broken = tmp_path / "broken-llama-server"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    server = {"cache_repair": False, "startup_timeout_s": 1}
    profile = {"provider": "local", "model_path": str(model), "server": server}
    gw = start_gateway({"broken": profile}, llama_server_bin=str(broken))
    with httpx.Client(base_url=gw.url, timeout=10) as http:
        (model_shown,) = get(http, "/ui/api/models")["models"]
    (shown,) = model_shown["servers"]
    assert shown["state"] == "failed" and shown["uptime_s"] is None
    assert model_shown["not_ready"]
