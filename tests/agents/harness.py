"""One agent run: the scripted model, the gateway from this tree's sources in a process of
its own, a temporary workspace and home, and the agent's process with a bounded time.

    run = run_agent("claude-code", launch, break_at=BreakPoint.IN_TEXT, root=tmp_path)
    run.returncode, run.stdout, run.stderr, run.file_text, run.calls, run.model.broke

`upstream` says what the gateway's profile makes of the scripted model: `llama.cpp` (the
default: `provider: local`, which continues a broken stream) or `cloud` (the same model as
an `openai-compatible` API, which the gateway does not continue: after content the agent
gets its own API's failure, and retries or not, as the agent does with a cloud model).

`launch` turns a `RunContext` (the gateway's URL, the workspace, the home, the task and
its prompt) into an `AgentCommand`: the argv, the environment added to a bare one (PATH,
HOME, locale; no proxies, no keys of this machine), and files to write first (an agent's
configuration in its home). Each run has its own model and gateway, so the gateway's
records (`run.calls`, the call log without the cache keeper's repairs) are that run's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import orjson
import yaml

from boundedcode_gateway.metering.calllog import read_calls
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE
from tests.agents.scripted_model import BreakPoint, ScriptedModel, Task, task_prompt

REPO = Path(__file__).resolve().parents[2]
INSTALL_HINT = "run `make agents` (a step of `make test`) to install the pinned agents"
# the profile the agents are pointed at, as docs/fronts.md names it
PROFILE = "local"
TASK_TEXT = "hello from the scripted model"

# what the gateway's profile makes of the scripted model (module docstring)
Upstream = Literal["llama.cpp", "cloud"]
LLAMA_CPP: Upstream = "llama.cpp"
CLOUD: Upstream = "cloud"


def upstream_profile(upstream: Upstream, url: str) -> dict[str, str]:
    """The profile `local` for the scripted model at `url`, as that kind of upstream."""
    if upstream == CLOUD:
        # an OpenAI-compatible service needs only its base URL (a key where it checks one)
        return {"provider": "openai-compatible", "base_url": url + "/v1"}
    return {"provider": "local", "external_url": url}


def case_name(agent: str, point: BreakPoint, upstream: Upstream = LLAMA_CPP) -> str:
    """A run's folder and artifact name: `<agent>-<point>`, `<agent>-cloud-<point>`."""
    where = "" if upstream == LLAMA_CPP else f"{upstream}-"
    return f"{agent}-{where}{point.value}"


@dataclass(frozen=True)
class RunContext:
    """What an agent's command is made from."""

    gateway_url: str  # http://127.0.0.1:PORT, no path
    workspace: Path
    home: Path
    task: Task
    prompt: str


@dataclass(frozen=True)
class AgentCommand:
    """How to start the agent: argv, environment (added to a bare one), files to write."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[Path, str] = field(default_factory=dict)


Launch = Callable[[RunContext], AgentCommand]
# an agent's name → what makes its launch (and fails, saying how to install it, when the
# agent is missing); the agents' modules fill it when they are imported
Launcher = Callable[[], Launch]
LAUNCHERS: dict[str, Launcher] = {}


def register(agent: str, launcher: Launcher) -> None:
    """Make `agent` runnable by the matrix of runs (tests/agents/conftest.py)."""
    LAUNCHERS[agent] = launcher


@dataclass
class AgentRun:
    """What one run of an agent left."""

    agent: str
    break_at: BreakPoint
    returncode: int | None  # None: killed at the time limit
    stdout: str
    stderr: str
    file_text: str | None
    calls: list[dict[str, Any]]
    model: ScriptedModel
    task: Task
    gateway_output: str
    seconds: float
    upstream: Upstream = LLAMA_CPP

    def __repr__(self) -> str:
        where = f"{self.upstream}, {self.break_at.value}"
        return f"AgentRun({self.agent}, {where}, rc={self.returncode})"

    @property
    def refused(self) -> list[dict[str, Any]]:
        """The calls the gateway answered with a 4xx."""
        return [c for c in self.calls if 400 <= int(c.get("http_status") or 0) < 500]

    @property
    def broken_calls(self) -> list[dict[str, Any]]:
        """The calls one of whose attempts broke."""
        return [
            c
            for c in self.calls
            if any(a.get("code") == "upstream_stream_broken" for a in c.get("attempt_log", []))
        ]

    def summary(self) -> str:
        """What the agent saw and what the gateway recorded, for a failing assertion."""
        rows = [
            f"{c.get('front')} {c.get('http_status')} {c.get('error_code')} "
            f"stream={c.get('stream')} retried={c.get('retried')} "
            f"attempts={c.get('attempt_log')} adj={sorted(c.get('adjustments') or {})}"
            for c in self.calls
        ]
        steps = [f"{a.step}{'(broke)' if a.broke else ''}" for a in self.model.answers]
        return "\n".join(
            [
                f"{self.agent} upstream={self.upstream} break={self.break_at.value} "
                f"rc={self.returncode} "
                f"in {self.seconds:.0f}s; model broke: {self.model.broke}",
                f"model answers: {steps}",
                "gateway records:",
                *[f"  {r}" for r in rows],
                f"file: {self.file_text!r}",
                "stdout (tail): " + self.stdout[-1500:],
                "stderr (tail): " + self.stderr[-2500:],
            ]
        )


# the environment each gateway is started with, copied once, on the main thread, when the
# module is imported: the runs start their gateways from threads of their own, while pytest
# sets and removes PYTEST_CURRENT_TEST on the main thread, and copying os.environ as a key
# goes raises KeyError
STARTING_ENVIRONMENT = dict(os.environ)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def gateway_process(
    data_dir: Path, upstream_url: str, upstream: Upstream = LLAMA_CPP
) -> Iterator[tuple[str, list[str]]]:
    """`boundedcode-gateway serve` from this tree's sources with one profile, `local`, on
    the upstream; yields its URL and, once it stopped, what it wrote (the list's one item)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    config = data_dir / "gateway.yaml"
    profiles = {PROFILE: upstream_profile(upstream, upstream_url)}
    config.write_text(yaml.safe_dump({"data_dir": str(data_dir), "models": profiles}))
    # this tree's gateway, or the one whose sources AGENTS_GATEWAY_SRC names
    src = os.environ.get("AGENTS_GATEWAY_SRC") or str(REPO / "src")
    env = {**STARTING_ENVIRONMENT, "PYTHONPATH": os.pathsep.join([src, str(REPO)])}
    port = free_port()
    log = (data_dir / "gateway.out").open("wb")
    argv = [sys.executable, "-m", "boundedcode_gateway", "serve", "--config", str(config)]
    proc = subprocess.Popen(
        [*argv, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env
    )
    output: list[str] = []
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    "the gateway did not start:\n" + (data_dir / "gateway.out").read_text()
                )
            time.sleep(0.1)
        yield url, output
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
        output.append((data_dir / "gateway.out").read_text(errors="replace"))


def bare_env(home: Path, path_dirs: list[str]) -> dict[str, str]:
    """An environment with nothing of this machine's but its programs and locale."""
    system_path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    return {
        "PATH": os.pathsep.join([*path_dirs, system_path]),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CI": "1",
        "TMPDIR": str(home / "tmp"),
        "NO_PROXY": "127.0.0.1,localhost",
    }


def _run_process(command: AgentCommand, cwd: Path, timeout_s: float) -> tuple[int | None, str, str]:
    proc = subprocess.Popen(
        command.argv,
        cwd=cwd,
        env=command.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # the agent's own children go with it at the time limit
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        code = None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # what it left running in the background
    return code, out.decode(errors="replace"), err.decode(errors="replace")


def run_agent(
    agent: str,
    launch: Launch,
    *,
    break_at: BreakPoint,
    root: Path,
    timeout_s: float = 90.0,
    path_dirs: list[str] | None = None,
    upstream: Upstream = LLAMA_CPP,
) -> AgentRun:
    """Run one agent on the task through a gateway of its own; `root` is an empty folder."""
    workspace, home = root / "workspace", root / "home"
    for folder in (workspace, home, home / "tmp"):
        folder.mkdir(parents=True, exist_ok=True)
    task = Task(str(workspace / "hello.txt"), TASK_TEXT)
    model = ScriptedModel(break_at)
    started = time.monotonic()
    with (
        model.serve() as model_url,
        gateway_process(root / "gateway", model_url, upstream) as (url, out),
    ):
        ctx = RunContext(url, workspace, home, task, task_prompt(task))
        command = launch(ctx)
        for path, text in command.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        env = {**bare_env(home, path_dirs or []), **command.env}
        code, stdout, stderr = _run_process(
            AgentCommand(command.argv, env, {}), workspace, timeout_s
        )
    target = Path(task.path)
    calls = [
        c for c in read_calls(root / "gateway" / "calls.jsonl") if c["purpose"] != REPAIR_PURPOSE
    ]
    return AgentRun(
        agent=agent,
        break_at=break_at,
        returncode=code,
        stdout=stdout,
        stderr=stderr,
        file_text=target.read_text() if target.is_file() else None,
        calls=calls,
        model=model,
        task=task,
        gateway_output=out[0] if out else "",
        seconds=time.monotonic() - started,
        upstream=upstream,
    )


# an agent whose flow is not the tool calls' (aider: an edit, then its commit) → what its
# run got wrong, in the words `problems` uses (the verdict reads "the broken call ...")
Problems = Callable[[AgentRun], list[str]]
OWN_CHECKS: dict[str, Problems] = {}


def problems(run: AgentRun) -> list[str]:
    """What a run of an agent that calls tools got wrong, whatever the agent and the break;
    empty when nothing. An agent in `OWN_CHECKS` is judged by its own check."""
    if run.agent in OWN_CHECKS:
        return OWN_CHECKS[run.agent](run)
    if run.returncode is None:
        return ["the agent did not finish in time"]
    found = run_problems(run)
    if run.file_text is None or run.file_text.rstrip("\n") != run.task.text:
        found.append(f"the file holds {run.file_text!r}")
    steps = {a.step for a in run.model.answers}
    # the write, then the read-back once the agent ran the write, then the closing text
    if not {"write", "read", "done"} <= steps:
        found.append(f"the model got only to {sorted(steps)}")
    elif "done" not in run.stdout.lower():
        found.append("the agent did not say done")
    return found + break_problems(run)


def run_problems(run: AgentRun) -> list[str]:
    """What every agent's finished run can get wrong, whatever its flow: a break asked for
    that never came, a call the gateway refused, an exit status other than 0."""
    found: list[str] = []
    if run.break_at is not BreakPoint.NONE and run.model.broke is None:
        found.append("the stream was never broken")
    if run.refused:
        codes = ", ".join(f"{c.get('http_status')} {c.get('error_code')}" for c in run.refused)
        found.append(f"the gateway refused {len(run.refused)} calls ({codes})")
    if run.returncode != 0:
        found.append(f"the agent exited {run.returncode}")
    return found


def break_problems(run: AgentRun) -> list[str]:
    """What the gateway's records say went wrong with the break; empty when nothing.

    The gateway carries an answer through, within the call it broke in, on a llama.cpp
    upstream (continued, or sent again when nothing was shown) and before any content on
    a cloud one. After content on a cloud upstream the call ends in the failure, recorded
    once, and the agent's own retry is a later call the model answers the broken step in.
    """
    broken = run.broken_calls
    if run.break_at is BreakPoint.NONE and broken:
        return ["a stream broke with no break asked for"]
    if run.break_at is BreakPoint.NONE or run.model.broke is None:
        return []
    ends = [(c.get("status"), c.get("error_code"), c.get("retried")) for c in broken]
    if run.upstream == LLAMA_CPP or run.break_at is BreakPoint.BEFORE_CONTENT:
        whole = len(broken) == 1 and broken[0]["retried"] is True and broken[0]["status"] == "ok"
        return [] if whole else [f"the broken call was not carried through by the gateway {ends}"]
    if ends != [("error", "upstream_stream_broken", False)]:
        return [f"the failure was not recorded once {ends}"]
    later = run.calls[run.calls.index(broken[0]) + 1 :]
    answers = run.model.answers
    at = next(i for i, a in enumerate(answers) if a.broke)
    again = any(a.step == run.model.broke.step for a in answers[at + 1 :])
    if not again or not any(c.get("status") == "ok" for c in later):
        return ["the agent did not retry the broken call"]
    return []


def retry_of(run: AgentRun) -> dict[str, Any] | None:
    """The agent's own retry of a call that ended in the failure: the next call after it."""
    failed = [c for c in run.broken_calls if c.get("status") == "error"]
    if len(failed) != 1:
        return None
    later = run.calls[run.calls.index(failed[0]) + 1 :]
    return later[0] if later else None


def check_run(run: AgentRun) -> None:
    """Fails with what went wrong, and the run's summary, unless the run did it all."""
    found = problems(run)
    assert not found, "; ".join(found) + "\n" + run.summary()


def verdict(run: AgentRun) -> str:
    """ "pass", or what went wrong; a run the agent itself recovered says so, and a cloud
    run whose agent retried the failure, how it retried."""
    found = problems(run)
    retry = retry_of(run)
    if not found and retry is not None:
        how = "streamed" if retry.get("stream") else "without streaming"
        return f"pass: the agent retried ({how})"
    if not found:
        return "pass"
    carried = [p for p in found if not p.startswith("the broken call")]
    if not carried:
        return "agent recovered on its own: " + found[0]
    return "fail: " + "; ".join(found)


def what_it_saw(run: AgentRun) -> str:
    """The agent's last line of output when it ended well, else its last word on an error."""
    out = [ln.strip() for ln in run.stdout.splitlines() if ln.strip()]
    if run.returncode == 0 and out:
        return out[-1][:200]
    lines = [ln.strip() for ln in (run.stdout + "\n" + run.stderr).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() and "ripgrep" not in ln.lower()]
    return (errors or lines or [f"exit {run.returncode}"])[-1][:200]


def dump(run: AgentRun, path: Path) -> None:
    """The run's outcome as JSON (the measured matrix is made of these)."""
    path.write_bytes(
        orjson.dumps(
            {
                "agent": run.agent,
                "upstream": run.upstream,
                "break_at": run.break_at.value,
                "verdict": verdict(run),
                "saw": what_it_saw(run),
                "fronts": sorted({str(c.get("front")) for c in run.calls}),
                "returncode": run.returncode,
                "file_text": run.file_text,
                "broke": None if run.model.broke is None else run.model.broke.step,
                "refused": [(c["http_status"], c["error_code"]) for c in run.refused],
                "summary": run.summary(),
            },
            option=orjson.OPT_INDENT_2,
        )
    )
