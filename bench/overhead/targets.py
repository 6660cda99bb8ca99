"""The targets: how each is started on loopback and how a request to it is addressed.

``direct`` is the fake itself; the others are started once per run, pinned to
the target core, and stopped by PID at the end. A peer that is not installed
is reported as missing instead of failing the run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.overhead import procs
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


def _gateway_config(env: Env, name: str, metering: bool, with_claude: bool) -> Path:
    fake = f"http://127.0.0.1:{env.fake_port}/v1"
    lines = [
        f"data_dir: {env.work / name}",
        *([] if metering else ["metering: false"]),
        # gateway-auth: every request carries a caller key the gateway looks up
        *(_auth_lines() if name == "gateway-auth" else []),
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


def _gateway(env: Env, name: str, metering: bool) -> Running:
    key = CALLER_KEY if name == "gateway-auth" else "unused"
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
    "gateway-auth": lambda env: _gateway(env, "gateway-auth", metering=True),
    "litellm": _litellm,
    "portkey": _portkey,
}
ALL_TARGETS = tuple(STARTERS)
PEERS = ("litellm", "portkey")

# keep the environment the targets inherit free of proxies (loopback only)
for _var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
    os.environ.pop(_var, None)
