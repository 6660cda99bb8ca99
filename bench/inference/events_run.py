"""The events benchmark's runs: each event (bench/inference/events.py) in each mode, on fresh
processes, every call streamed, timed and counted.

- **The calls.** Each is streamed (``stream_options.include_usage``) and its time to
  first token taken where the caller sees it, in every mode alike: from sending the
  request to the first chunk that carries a token (``streamed.py``). The agent's
  caller drops ``reasoning_content`` from its history (as OpenHands does); the
  gateway runs ``reasoning_history: auto``.
- **What was evaluated.** The gateway modes: the call log's ``evaluated_tokens`` (and
  the cache repair's own records, beside the call they followed), joined to the calls
  in the order sent. LiteLLM: the servers' ``/metrics`` counter
  ``llamacpp:prompt_tokens_total`` (cached tokens excluded), read before and after each
  call over the servers that are up, as ``run.py`` does.
- **Between calls.** The gateway modes wait for the cache repair of each answer (at
  most ``REPAIR_WAIT_S``); then every mode waits ``tool_time_s``, the time an agent
  spends running its tool. Before a kill, ``slot-files`` waits for the task's slot to
  be saved (``prompt_cache.idle_save_s``, short here): the crash of a server between
  the turns of an agent whose tools ran longer than that.
- **After a restart** the next call is sent once the server answers again, in every
  mode: its time to first token leaves out the server's start.

Every process is started and stopped by PID (``bench/real_server.py``); every wait is
bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from bench import real_server
from bench.inference.caller import Caller
from bench.inference.events import (
    GATEWAY_MODES,
    LITELLM,
    SIDE_MAX_TOKENS,
    SLOT_FILES,
    Event,
    PlannedCall,
    plan,
    side_messages,
)
from bench.inference.pool_run import task_workload
from bench.inference.streamed import StreamedAnswer
from bench.inference.workload import Workload
from bench.overhead import procs
from boundedcode_gateway.llama_server.flags import SLOTS_DEBUG_ENV
from boundedcode_gateway.llama_server.slot_store import SLOT_FILES_FOLDER
from boundedcode_gateway.metering.records import OWN_RECORD_PURPOSES
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE

PROFILE = "local"
# the longest the runner waits for: an answer's cache repair, a slot's save, a server to
# go down or come back
REPAIR_WAIT_S = 20.0
SAVE_WAIT_S = 30.0
SERVER_WAIT_S = 120.0
POLL_S = 0.05
# calls queue behind full re-evaluations on two shared cores: the gateway waits long
READ_TIMEOUT_S = 1800.0
# what the gateway's call log says of each call, kept in its row
LOG_KEYS = (
    "evaluated_tokens",
    "cached_tokens",
    "restored_tokens",
    "slot_restore_ms",
    "slot_save_ms",
    "restore_failure",
    "miss_cause",
    "server",
    "status",
)


@dataclass(frozen=True, slots=True)
class EventSettings:
    model: str
    template: Path
    reasoning_budget: int
    max_tokens: int  # the agent's turns
    temperature: float
    seed: int  # task n sends seed + n
    threads: int  # per server
    ctx_size: int  # per server: one slot
    idle_save_s: float  # the gateway's prompt_cache.idle_save_s
    tool_time_s: float  # between an answer (and its repair) and the next call
    call_timeout_s: float
    run_timeout_s: float  # one event in one mode


def server_extra(settings: EventSettings, cache_ram_mib: int) -> list[str]:
    """The flags every server of a run gets, whoever runs it."""
    return [
        *("--reasoning-budget", str(settings.reasoning_budget)),
        *("--cache-ram", str(cache_ram_mib)),
        *("--threads", str(settings.threads)),
    ]


def gateway_config(data_dir: Path, event: Event, mode: str, settings: EventSettings) -> Path:
    """A gateway with one managed ``local`` profile of ``event.servers`` servers of one slot."""
    server: dict[str, Any] = {
        "parallel": 1,
        "ctx_size": settings.ctx_size,
        "cache_ram_mib": event.cache_ram_mib,
        "threads": settings.threads,
        "chat_template_file": str(settings.template),
        "extra_args": ["--reasoning-budget", str(settings.reasoning_budget), "--metrics"],
    }
    local: dict[str, Any] = {
        "provider": "local",
        "model_path": settings.model,
        "reasoning_history": "auto",
        "server": server,
    }
    if event.servers > 1:
        local.update(replicas=event.servers, routing="affinity")
    whole = {
        "data_dir": str(data_dir),
        "prompt_cache": {"slot_files": mode == SLOT_FILES, "idle_save_s": settings.idle_save_s},
        "inference": {"read_timeout_s": READ_TIMEOUT_S, "max_call_s": None},
        "models": {PROFILE: local},
    }
    config = data_dir / "gateway.yaml"
    config.write_text(yaml.safe_dump(whole))
    return config


def _wait(what: str, done: Callable[[], bool], timeout_s: float) -> bool:
    """Until ``done()``, at most ``timeout_s``; whether it came (a note on stdout if not)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            print(f"  (gave up waiting for {what} after {timeout_s:.0f} s)", flush=True)
            return False
        time.sleep(POLL_S)
    return True


def is_call(record: dict[str, Any]) -> bool:
    """Whether a call log record is a caller's call: not the gateway's own work (a cache
    repair, a slot save)."""
    return record["purpose"] != REPAIR_PURPOSE and record["purpose"] not in OWN_RECORD_PURPOSES


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class Rig:
    """Where a run's calls go, and what the benchmark does to it between them."""

    url: str
    model: str

    def headers(self, task: str, purpose: str) -> dict[str, str]:
        raise NotImplementedError

    def counter(self) -> int | None:
        """The servers' evaluated prompt tokens so far (None: the call log tells)."""
        return None

    def settle(self, task: str, answered: int) -> None:
        """After ``answered`` calls of ``task``: what follows an answer has ended."""

    def act(self, event: Event, task: str) -> str | None:
        """Do the event's action; a note for the row where it did not go as planned."""
        raise NotImplementedError


class GatewayRig(Rig):
    """The gateway as a subprocess, running its own servers."""

    def __init__(
        self, event: Event, mode: str, settings: EventSettings, run_dir: Path, stack: ExitStack
    ) -> None:
        self.data_dir = run_dir / "gateway"
        self.data_dir.mkdir(parents=True)
        self.config = gateway_config(self.data_dir, event, mode, settings)
        self.run_dir = run_dir
        self.slot_files = mode == SLOT_FILES
        self.model = PROFILE
        self._starts = 0
        self._front = ExitStack()
        stack.callback(self._front.close)
        self._start()

    def _start(self) -> None:
        self._starts += 1
        name = f"gateway-{self._starts}"
        self.url = self._front.enter_context(real_server.gateway(self.config, self.run_dir, name))

    def headers(self, task: str, purpose: str) -> dict[str, str]:
        return {"X-BoundedCode-Task": task, "X-BoundedCode-Purpose": purpose}

    def _records(self, task: str) -> list[dict[str, Any]]:
        return [c for c in real_server.calls(self.data_dir) if c["task"] == task]

    def settle(self, task: str, answered: int) -> None:
        def repaired() -> bool:
            """The call's record is written, and a repair record began after it."""
            records = self._records(task)
            calls = [c for c in records if is_call(c)]
            if len(calls) < answered:
                return False
            last = calls[-1]["started_at"]
            return any(c["purpose"] == REPAIR_PURPOSE and c["started_at"] > last for c in records)

        _wait(f"the repair of answer {answered} of {task}", repaired, REPAIR_WAIT_S)

    def _servers(self) -> list[dict[str, Any]]:
        models = httpx.get(self.url + "/ui/api/models", timeout=30).json()["models"]
        servers: list[dict[str, Any]] = next(m for m in models if m["name"] == PROFILE)["servers"]
        return servers

    def _saved(self, task: str) -> bool:
        """Whether the task's slot was saved since its last answer's repair began."""
        records = self._records(task)
        repairs = [c for c in records if c["purpose"] == REPAIR_PURPOSE]
        since = _epoch((repairs or records)[-1]["started_at"])
        for about in (self.data_dir / SLOT_FILES_FOLDER).glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                data = orjson.loads(about.read_bytes())
                if data.get("task") == task and float(data.get("saved_at", 0)) >= since:
                    return True
        return False

    def act(self, event: Event, task: str) -> str | None:
        note = None
        if event.action == "restart-front":
            self._front.close()
            self._start()
            return None
        if self.slot_files and not _wait(
            f"{task}'s slot to be saved", lambda: self._saved(task), SAVE_WAIT_S
        ):
            note = "the slot was not saved before the kill"
        home = [c for c in self._records(task) if is_call(c)][-1]["server"]
        server = next(s for s in self._servers() if s["name"] == home)
        pid, restarts = server["pid"], server["restarts"]
        os.kill(pid, signal.SIGKILL)

        def state() -> tuple[int, str, int | None]:
            server = next(s for s in self._servers() if s["name"] == home)
            return int(server["restarts"]), str(server["state"]), server["pid"]

        if event.action == "kill-server":
            started = _wait(
                f"{home} to start again",
                lambda: state()[:2] == (restarts + 1, "ready"),
                SERVER_WAIT_S,
            )
            if not started:
                note = f"{home} did not start again"
        else:  # kill-for-good: the next call at once, as soon as the gateway saw it go
            _wait(f"{home} to go down", lambda: state()[1] != "ready", SERVER_WAIT_S)
        return note


class OwnServer:
    """A llama-server the benchmark runs itself, on one port for all its starts."""

    def __init__(self, name: str, argv: list[str], port: int, log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.url = f"http://127.0.0.1:{port}"
        self.log_dir = log_dir
        self.proc: procs.Proc | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        env = dict(SLOTS_DEBUG_ENV)
        proc = procs.start(f"{self.name}-{self.starts}", self.argv, None, self.log_dir, env)
        self.proc = proc
        try:
            real_server.wait_healthy(proc, self.url, "/health", real_server.STARTUP_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    def kill(self) -> None:
        """SIGKILL, as a crash; waited for."""
        if self.proc is not None and self.proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.popen.wait(30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc, grace_s=20)
        self.proc = None


class LiteLLMRig(Rig):
    """LiteLLM's proxy in front of the benchmark's own llama-servers: one, or (failover)
    two deployments of one model, the second taking calls once the first is down."""

    def __init__(
        self, event: Event, settings: EventSettings, run_dir: Path, stack: ExitStack
    ) -> None:
        extra = server_extra(settings, event.cache_ram_mib)
        self.servers: list[OwnServer] = []
        for n in range(event.servers):
            port = procs.free_port()
            argv = real_server.llama_server_argv(settings.model, settings.template, port, extra)
            server = OwnServer(f"llama-server-{n + 1}", argv, port, run_dir)
            stack.callback(server.stop)
            server.start()
            self.servers.append(server)
        self.run_dir = run_dir
        self.model = real_server.LITELLM_MODEL
        self._starts = 0
        self._front = ExitStack()
        stack.callback(self._front.close)
        self._start()

    def _start(self) -> None:
        self._starts += 1
        first, *others = [s.url for s in self.servers]
        proxy = real_server.litellm_proxy(first, self.run_dir, f"litellm-{self._starts}", others)
        self.url = self._front.enter_context(proxy)

    def headers(self, task: str, purpose: str) -> dict[str, str]:
        return {"authorization": f"Bearer {real_server.LITELLM_KEY}"}

    def counter(self) -> int | None:
        total = 0
        with httpx.Client(timeout=30) as client:
            for server in self.servers:
                if server.proc is None:
                    continue
                for line in client.get(server.url + "/metrics").text.splitlines():
                    if line.startswith("llamacpp:prompt_tokens_total "):
                        total += int(float(line.split()[1]))
        return total

    def act(self, event: Event, task: str) -> str | None:
        if event.action == "restart-front":
            self._front.close()
            self._start()
        elif event.action == "kill-server":
            self.servers[0].kill()
            self.servers[0].start()
        elif event.action == "kill-for-good":
            self.servers[0].kill()
        return None


@contextmanager
def rig(event: Event, mode: str, settings: EventSettings, run_dir: Path) -> Iterator[Rig]:
    with ExitStack() as stack:
        if mode in GATEWAY_MODES:
            yield GatewayRig(event, mode, settings, run_dir, stack)
        elif mode == LITELLM:
            yield LiteLLMRig(event, settings, run_dir, stack)
        else:
            raise ValueError(f"unknown mode {mode}")


def stream_call(
    client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[StreamedAnswer, float]:
    """Send ``body`` streamed; the answer and the milliseconds the whole call took."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    answer = StreamedAnswer()
    started = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as resp:
        if resp.status_code != 200:
            resp.read()
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:500]}")
        for line in resp.iter_lines():
            answer.feed(line, (time.perf_counter() - started) * 1000)
    if not answer.done:
        raise RuntimeError("the stream ended without [DONE]")
    return answer, (time.perf_counter() - started) * 1000


def _request(
    call: PlannedCall, caller: Caller, history: list[dict[str, Any]], settings: EventSettings
) -> tuple[dict[str, Any], str]:
    """The body of one planned call, and its purpose (a side request: the agent's own, as
    Claude Code sends its side requests on the same task)."""
    if call.kind == "agent":
        request = caller.next_request()
        history[:] = request.messages
        body: dict[str, Any] = {"messages": request.messages, "max_tokens": settings.max_tokens}
        if request.tools:
            body["tools"] = request.tools
        return body, request.purpose
    messages = side_messages(call.kind, history)
    purpose = caller.workload.steps[0].purpose
    return {"messages": messages, "max_tokens": SIDE_MAX_TOKENS}, purpose


def run_event(
    event: Event, mode: str, workload: Workload, settings: EventSettings, run_dir: Path
) -> list[dict[str, Any]]:
    """Every call of one run of ``event`` in ``mode``: one row each, in order."""
    run_dir.mkdir(parents=True)
    tasks = [task_workload(workload, n) for n in range(1, event.tasks + 1)]
    callers = [Caller(t, keep_reasoning=False) for t in tasks]
    histories: list[list[dict[str, Any]]] = [[] for _ in tasks]
    answered = [0 for _ in tasks]
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + settings.run_timeout_s
    with (
        rig(event, mode, settings, run_dir) as front,
        httpx.Client(timeout=settings.call_timeout_s) as client,
    ):
        calls = plan(event)
        for call in calls:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the run's {settings.run_timeout_s:.0f} s were up")
            i = call.task - 1
            task = tasks[i].task
            note = front.act(event, task) if call.event_before else None
            body, purpose = _request(call, callers[i], histories[i], settings)
            body.update(
                model=front.model,
                temperature=settings.temperature,
                seed=settings.seed + call.task,
            )
            before = front.counter()
            answer, wait_ms = stream_call(client, front.url, body, front.headers(task, purpose))
            after = front.counter()
            message = answer.message()
            if call.kind == "agent":
                callers[i].record_answer(message)
                histories[i].append(message)
            answered[i] += 1
            usage = answer.usage or {}
            rows.append(
                {
                    "event": event.name,
                    "mode": mode,
                    "kind": call.kind,
                    "seq": call.seq,
                    "task": task,
                    "task_n": call.task,
                    "turn": call.turn,
                    "event_before": call.event_before,
                    "after_event": call.after_event,
                    "note": note,
                    "prompt_tokens": usage.get("prompt_tokens"),
                    "completion_tokens": usage.get("completion_tokens"),
                    "reasoning_chars": len(message.get("reasoning_content") or ""),
                    "tool_calls": len(message.get("tool_calls") or []),
                    "finish_reason": answer.finish_reason,
                    "ttft_ms": answer.first_token_ms,
                    "wait_ms": round(wait_ms, 1),
                    "server_evaluated": None if after is None else after - (before or 0),
                }
            )
            front.settle(task, answered[i])
            if call.seq < len(calls):
                time.sleep(settings.tool_time_s)
    if mode in GATEWAY_MODES:
        join_call_log(rows, real_server.calls(run_dir / "gateway"))
    else:
        for row in rows:
            row["evaluated_tokens"] = row["server_evaluated"]
            row["repair_evaluated"] = 0
    return rows


def join_call_log(rows: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]]) -> None:
    """Each row gets its call's record (per task, in the order sent) and what the cache
    repairs after it evaluated."""
    for task in {r["task"] for r in rows}:
        mine = sorted((c for c in records if c["task"] == task), key=lambda c: c["started_at"])
        sent = [r for r in rows if r["task"] == task]
        calls = [c for c in mine if is_call(c)]
        if len(calls) != len(sent):
            raise RuntimeError(f"{task}: {len(sent)} calls sent, {len(calls)} in the call log")
        for row, record in zip(sent, calls, strict=True):
            row.update({k: record.get(k) for k in LOG_KEYS})
            row["gateway_ttft_ms"] = record.get("ttft_ms")
            row["repair_evaluated"] = 0
        n = -1
        for record in mine:
            if is_call(record):
                n += 1
            elif n >= 0 and record["purpose"] == REPAIR_PURPOSE:
                sent[n]["repair_evaluated"] += record.get("evaluated_tokens") or 0


def run_events(
    events: Sequence[Event],
    modes: Sequence[str],
    workload: Workload,
    settings: EventSettings,
    out: Path,
    sink: Callable[[list[dict[str, Any]]], None],
) -> list[dict[str, Any]]:
    """Each event in each mode, one after the other; each run's rows go to ``sink`` as it
    ends (a run that failed: one ``error`` row)."""
    rows: list[dict[str, Any]] = []
    for event in events:
        for mode in modes:
            print(f"{event.name} / {mode} ...", flush=True)
            started = time.monotonic()
            load = round(os.getloadavg()[0], 2)  # what else the machine ran meanwhile
            try:
                got = run_event(event, mode, workload, settings, out / "runs" / event.name / mode)
            except Exception as exc:  # one run failing is reported, the others still run
                got = [{"event": event.name, "mode": mode, "kind": "error", "error": repr(exc)}]
                print(f"  failed: {exc!r}", flush=True)
            seconds = round(time.monotonic() - started, 1)
            for row in got:
                row.update(run_s=seconds, load_1m=load)
            sink(got)
            rows += got
    return rows
