"""The targets: how each is started on loopback and how a request to it is addressed.

``direct`` is the fake itself; the others are started once per run, pinned to
the target core, and stopped by PID at the end. A peer that is not installed
is reported as missing instead of failing the run.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from bench.overhead import procs
from bench.overhead.otlp_sink import OtlpSink
from bench.overhead.payloads import CLAUDE, MODEL

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO = BENCH_DIR.parent
PORTKEY_SERVER = BENCH_DIR / "node_modules/@portkey-ai/gateway/build/start-server.js"
LOOPBACK_PRELOAD = Path(__file__).resolve().parent / "loopback.mjs"
STARTUP_TIMEOUT_S = 90.0  # the LiteLLM proxy imports for a long while on a slow core
BENCH_KEY = "sk-bench-not-secret"
# the caller key of the gateway-auth target (its SHA-256 is in that gateway's auth:)
CALLER_KEY = "bcg_bench-caller-key-not-secret"


@dataclass
class Route:
    """Where one kind of request goes on a target: path, headers, model name."""

    path: str
    headers: dict[str, str]
    model: str


@dataclass
class Running:
    """A started target: its port, its routes by request kind ("openai", "anthropic")."""

    name: str
    port: int
    routes: dict[str, Route]
    proc: procs.Proc | None = None
    notes: dict[str, str] = field(default_factory=dict)  # lane kind → why it is n/a


@dataclass
class Env:
    fake_port: int
    core: int | None
    work: Path  # a temporary folder for configs, data and logs
    # what a target made outside the folder (a database), undone at the end of the run
    cleanups: list[Callable[[], None]] = field(default_factory=list)


Starter = Callable[[Env], Running]


def _direct(env: Env) -> Running:
    anthropic_headers = {"x-api-key": BENCH_KEY, "anthropic-version": "2023-06-01"}
    return Running(
        "direct",
        env.fake_port,
        {
            "openai": Route("/v1/chat/completions", {}, MODEL),
            "anthropic": Route("/v1/messages", anthropic_headers, "claude-x"),
        },
    )


# the targets whose requests carry a caller key the gateway looks up
WITH_AUTH = (
    "gateway-auth",
    "gateway-limits",
    "gateway-pg",
    "gateway-budgets-pg",
    "gateway-rates-pg",
    "gateway-limits-pg",
)
# limits no request of the run reaches: what is measured is the checking
BUDGET_LINES = ["budgets:", "  task: {max_tokens: 1000000000000, per: lifetime}"]
RATE_LINES = [
    "rate_limits:",
    "  per_caller: {requests: {limit: 1000000000, window_s: 60}, in_flight: 100000}",
    "  per_task: {tokens: {limit: 1000000000000, window_s: 60}}",
    "  max_waiting: 100000",
]
LIMITS_LINES = {
    "gateway-limits": BUDGET_LINES + RATE_LINES,
    "gateway-budgets-pg": BUDGET_LINES,
    "gateway-rates-pg": RATE_LINES,
    "gateway-limits-pg": BUDGET_LINES + RATE_LINES,
}
# the PostgreSQL server the shared targets keep their ledger, budgets and windows in
PG_ADMIN_URL = os.environ.get("BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


# the traced targets' share of calls exported as spans (every call's metrics are)
SAMPLING = {"gateway-traced": 1.0, "gateway-sampled": 0.1}


def _observability_lines(env: Env, name: str) -> list[str]:
    """Calls traced (every one, or one in ten) and their metrics exported, to a collector
    that takes them; for the traced targets alone."""
    if name not in SAMPLING:
        return []
    sink = OtlpSink()
    env.cleanups.append(sink.close)
    return [
        "observability:",
        f"  endpoint: {sink.url}",
        f"  sampling: {SAMPLING[name]}",
        "  metrics_interval_s: 5",
    ]


def _gateway_config(env: Env, name: str, metering: bool, with_claude: bool) -> Path:
    fake = f"http://127.0.0.1:{env.fake_port}/v1"
    lines = [
        f"data_dir: {env.work / name}",
        *([] if metering else ["metering: false"]),
        *_observability_lines(env, name),
        *([f"database: {_database(env, name)}"] if name.endswith("-pg") else []),
        *LIMITS_LINES.get(name, []),
        # every request carries a caller key the gateway looks up
        *(_auth_lines() if name in WITH_AUTH else []),
        "models:",
        f"  {MODEL}:",
        "    provider: openai-compatible",
        f"    base_url: {fake}",
        "    api_key_env: BENCH_UPSTREAM_KEY",
    ]
    if with_claude:
        lines += [
            f"  {CLAUDE}:",
            "    provider: anthropic",
            "    model: claude-x",
            f"    base_url: {fake}",
            "    api_key_env: BENCH_UPSTREAM_KEY",
        ]
    path = env.work / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _auth_lines() -> list[str]:
    digest = hashlib.sha256(CALLER_KEY.encode()).hexdigest()
    return ["auth:", "  keys:", f'    - {{name: bench, sha256: "{digest}", models: ["*"]}}']


def _start_gateway(
    env: Env, name: str, metering: bool, with_claude: bool
) -> tuple[procs.Proc, int]:
    config = _gateway_config(env, name, metering, with_claude)
    port = procs.free_port()
    argv = [sys.executable, "-m", "boundedcode_gateway", "serve", "--config", str(config)]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    proc = procs.start(name, argv, env.core, env.work, {"BENCH_UPSTREAM_KEY": BENCH_KEY})
    try:
        procs.wait_listening(proc, port, STARTUP_TIMEOUT_S)
    except RuntimeError:
        procs.stop(proc)
        raise
    return proc, port


def _database(env: Env, name: str) -> str:
    """A database of its own for target ``name``, dropped at the end of the run."""
    database = f"bench_{name.replace('-', '_')}_{os.getpid()}"
    base = PG_ADMIN_URL.rsplit("/", 1)[0]

    async def admin(statement: str) -> None:
        conn = await asyncpg.connect(PG_ADMIN_URL, timeout=10)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{database}"'))
    env.cleanups.append(lambda: asyncio.run(admin(f'DROP DATABASE IF EXISTS "{database}"')))
    return f"{base}/{database}"


def _gateway(env: Env, name: str, metering: bool) -> Running:
    key = CALLER_KEY if name in WITH_AUTH else "unused"
    headers = {"authorization": f"Bearer {key}"}
    openai = Route("/v1/chat/completions", headers, MODEL)
    try:
        proc, port = _start_gateway(env, name, metering, with_claude=True)
    except RuntimeError:
        # a gateway without the Anthropic adapter refuses the profile: the rest still runs
        proc, port = _start_gateway(env, name, metering, with_claude=False)
        running = Running(name, port, {"openai": openai}, proc)
        running.notes["anthropic"] = "n/a (no anthropic adapter)"
        return running
    anthropic = Route("/v1/chat/completions", headers, CLAUDE)
    return Running(name, port, {"openai": openai, "anthropic": anthropic}, proc)


def _litellm(env: Env) -> Running:
    binary = Path(sys.executable).parent / "litellm"
    if not binary.exists():
        raise FileNotFoundError("the LiteLLM proxy is not installed (make bench-overhead does it)")
    fake = f"http://127.0.0.1:{env.fake_port}"
    config = env.work / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {fake}/v1\n"
        f"      api_key: {BENCH_KEY}\n"
        f"  - model_name: {CLAUDE}\n"
        "    litellm_params:\n"
        "      model: anthropic/claude-x\n"
        f"      api_base: {fake}\n"
        f"      api_key: {BENCH_KEY}\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
    )
    port = procs.free_port()
    argv = [str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--num_workers", "1"]
    extra = {
        "LITELLM_MASTER_KEY": BENCH_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "DISABLE_ADMIN_UI": "True",
    }
    proc = procs.start("litellm", argv, env.core, env.work, extra)
    try:
        procs.wait_listening(proc, port, STARTUP_TIMEOUT_S)
    except RuntimeError:
        procs.stop(proc)
        raise
    auth = {"authorization": f"Bearer {BENCH_KEY}"}
    return Running(
        "litellm",
        port,
        {
            "openai": Route("/v1/chat/completions", auth, MODEL),
            "anthropic": Route("/v1/chat/completions", auth, CLAUDE),
        },
        proc,
    )


def _portkey(env: Env) -> Running:
    node = shutil.which("node")
    if node is None or not PORTKEY_SERVER.exists():
        raise FileNotFoundError(
            "the Portkey gateway is not installed (make bench-overhead does it)"
        )
    port = procs.free_port()
    argv = [node, "--import", str(LOOPBACK_PRELOAD), str(PORTKEY_SERVER), f"--port={port}"]
    argv.append("--headless")
    proc = procs.start("portkey", argv, env.core, env.work, {"NODE_ENV": "production"})
    try:
        procs.wait_listening(proc, port, STARTUP_TIMEOUT_S)
    except RuntimeError:
        procs.stop(proc)
        raise
    host = f"http://127.0.0.1:{env.fake_port}/v1"
    openai = {
        "authorization": f"Bearer {BENCH_KEY}",
        "x-portkey-provider": "openai",
        "x-portkey-custom-host": host,
    }
    anthropic = {
        "authorization": f"Bearer {BENCH_KEY}",
        "x-portkey-provider": "anthropic",
        "x-portkey-custom-host": host,
    }
    return Running(
        "portkey",
        port,
        {
            "openai": Route("/v1/chat/completions", openai, MODEL),
            "anthropic": Route("/v1/chat/completions", anthropic, "claude-x"),
        },
        proc,
    )


STARTERS: dict[str, Starter] = {
    "direct": _direct,
    "gateway": lambda env: _gateway(env, "gateway", metering=True),
    "gateway-nometer": lambda env: _gateway(env, "gateway-nometer", metering=False),
    # every call exported as OpenTelemetry spans and metrics (docs/observability.md)
    "gateway-traced": lambda env: _gateway(env, "gateway-traced", metering=True),
    "gateway-sampled": lambda env: _gateway(env, "gateway-sampled", metering=True),
    "gateway-auth": lambda env: _gateway(env, "gateway-auth", metering=True),
    # budgets and rate limits in the gateway's memory; beside gateway-auth
    "gateway-limits": lambda env: _gateway(env, "gateway-limits", metering=True),
    # the ledger in PostgreSQL; then the budgets, the rate windows and both shared there
    "gateway-pg": lambda env: _gateway(env, "gateway-pg", metering=True),
    "gateway-budgets-pg": lambda env: _gateway(env, "gateway-budgets-pg", metering=True),
    "gateway-rates-pg": lambda env: _gateway(env, "gateway-rates-pg", metering=True),
    "gateway-limits-pg": lambda env: _gateway(env, "gateway-limits-pg", metering=True),
    "litellm": _litellm,
    "portkey": _portkey,
}
ALL_TARGETS = tuple(STARTERS)
PEERS = ("litellm", "portkey")

# keep the environment the targets inherit free of proxies (loopback only)
for _var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
    os.environ.pop(_var, None)
