"""The embedded default as a new user runs it: ``boundedcode-gateway serve`` with no config.

One gateway (and its real llama-server with SmolLM2 and the shipped tool template)
for the module. Tool requests go through from the ``openai`` SDK and from LiteLLM;
a ``<tool_call>`` the model writes comes back as ``tool_calls``; and every python
and shell example of the README runs as written, against this gateway.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.test_cli import free_port

# LiteLLM fetches a price list over the network when imported unless told not to
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
import litellm

pytestmark = pytest.mark.llama_server

README = Path(__file__).resolve().parents[2] / "README.md"
STARTUP_S = 240
EXAMPLE_TIMEOUT_S = 240

READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file of the project",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "enum": ["README.md"]}},
            "required": ["path"],
        },
    },
}


@dataclass
class DefaultGateway:
    port: int
    cwd: Path  # the embedded default's data_dir, .gateway, is relative to it

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def default_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DefaultGateway]:
    cwd = tmp_path_factory.mktemp("default")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "BOUNDEDCODE_GATEWAY_CONFIG"}
    log = (cwd / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "boundedcode_gateway", "serve", "--port", str(port)],
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_until_serving(proc, port, cwd)
        yield DefaultGateway(port, cwd)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _wait_until_serving(proc: subprocess.Popen[bytes], port: int, cwd: Path) -> None:
    # /health answers 503 until the managed llama-server is up
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the default gateway did not start:\n{(cwd / 'serve.log').read_text()}")


def test_the_default_model_says_it_takes_tools(default_gateway: DefaultGateway) -> None:
    info = httpx.get(default_gateway.url + "/v1/models/local", timeout=10).json()
    assert info["capabilities"]["tools"] is True
    assert info["capabilities"]["source"] == "props"  # read from llama-server, not assumed


def test_a_tools_request_from_the_openai_sdk_goes_through(
    default_gateway: DefaultGateway,
) -> None:
    with default_gateway.client() as client:
        reply = client.chat.completions.create(
            model="local",
            messages=[{"role": "user", "content": "What is in README.md?"}],
            tools=[READ_FILE],  # type: ignore[list-item]
            max_tokens=16,
        )
    # answered (no 400 capability_missing), whether or not the model called the tool
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_a_tools_request_from_litellm_goes_through(default_gateway: DefaultGateway) -> None:
    reply = litellm.completion(
        model="openai/local",
        api_base=default_gateway.url + "/v1",
        api_key="unused",
        messages=[{"role": "user", "content": "What is in README.md?"}],
        tools=[READ_FILE],
        max_tokens=16,
        num_retries=0,
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


# The model's answer is prefilled with the opening <tool_call> (a trailing assistant message
# is continued); tool_choice "required" makes llama-server hold the rest to the grammar it
# derived from the shipped template: one tool name, and the enum leaves one argument value,
# so the call the model writes is the same on every run.
FORCED_CALL: dict[str, Any] = {
    "model": "local",
    "messages": [
        {"role": "user", "content": "Read the file README.md"},
        {"role": "assistant", "content": "<tool_call>\n"},
    ],
    "tools": [READ_FILE],
    "tool_choice": "required",
    "temperature": 0,
    "seed": 7,
    "max_tokens": 40,
}


def test_a_tool_call_the_model_writes_comes_back_as_tool_calls(
    default_gateway: DefaultGateway,
) -> None:
    with default_gateway.client() as client:
        reply = client.chat.completions.create(**FORCED_CALL)
    calls = reply.choices[0].message.tool_calls
    assert calls, reply.choices[0].message
    first = calls[0]
    assert first.type == "function" and first.function.name == "read_file"
    assert json.loads(first.function.arguments) == {"path": "README.md"}
    assert first.id  # the gateway adds one where the upstream gives none
    assert "<tool_call>" not in (reply.choices[0].message.content or "")


def test_a_streamed_tool_call_comes_back_as_tool_call_deltas(
    default_gateway: DefaultGateway,
) -> None:
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    content: list[str] = []
    with default_gateway.client() as client:
        for chunk in client.chat.completions.create(**FORCED_CALL, stream=True):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content.append(delta.content or "")
            for call in delta.tool_calls or []:
                if call.function and call.function.name:
                    names[call.index] = call.function.name
                if call.function and call.function.arguments:
                    arguments[call.index] = arguments.get(call.index, "") + call.function.arguments
    assert names.get(0) == "read_file"
    assert json.loads(arguments[0]) == {"path": "README.md"}
    assert "<tool_call>" not in "".join(content)


# How a README example is run here: against this test's gateway, not port 8780 (another
# gateway may be serving there), with the commands of this checkout's environment, and
# the interactive chat at the same address (its stdin is closed, so it checks the model
# and ends). `make run` and `make test` are the commands that build all this, the
# fast suite's own command runs this suite, and an install (of an extra the test
# environment has) changes the environment under test: not run.
NOT_RUN = ("make ", ".venv/bin/pytest ", ".venv/bin/pip ")


def _as_run_here(command: str, gw: DefaultGateway) -> str:
    venv_bin = Path(sys.executable).parent
    command = command.replace("127.0.0.1:8780", f"127.0.0.1:{gw.port}")
    command = command.replace(".venv/bin/", f"{venv_bin}/")
    return command.replace("boundedcode-gateway chat", f"boundedcode-gateway chat --url {gw.url}")


def readme_examples(text: str) -> list[tuple[str, str]]:
    """(language, code) of every ```sh and ```python block, in the README's order."""
    found: list[tuple[str, str]] = []
    for language, body in re.findall(r"```(sh|python)\n(.*?)```", text, flags=re.DOTALL):
        if language == "python":
            found.append(("python", body))
            continue
        for command in body.replace("\\\n", " ").splitlines():
            if command.strip() and not command.startswith(NOT_RUN):
                found.append(("sh", command))
    return found


def test_every_readme_example_runs_as_written(default_gateway: DefaultGateway) -> None:
    examples = readme_examples(README.read_text())
    languages = [language for language, _ in examples]
    # the quick start's curl and chat, the two python examples, the two calls commands
    assert languages.count("python") >= 1 and languages.count("sh") >= 4, examples
    for language, code in examples:
        if language == "python":
            argv = [sys.executable, "-c", _as_run_here(code, default_gateway)]
        else:
            argv = ["bash", "-c", _as_run_here(code, default_gateway)]
        done = subprocess.run(
            argv,
            cwd=default_gateway.cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=EXAMPLE_TIMEOUT_S,
        )
        out = done.stdout.decode()
        assert done.returncode == 0, f"{code}\n{out}\n{done.stderr.decode()}"
        if code.lstrip().startswith("curl"):
            assert json.loads(out)["choices"], out  # curl -s exits 0 on an HTTP error too
    calls = subprocess.run(
        [str(Path(sys.executable).parent / "boundedcode-gateway"), "calls", "--task", "demo-1"],
        cwd=default_gateway.cwd,
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert b"demo-1" in calls.stdout  # the python example's call was metered under its task
