"""The agents that speak the chat front, each set up as README.md says, headless.

- opencode (npm `opencode-ai`): its configuration's custom provider, `@ai-sdk/openai-compatible`
  at the gateway's `/v1`, and `opencode run`.
- OpenHands' SDK (PyPI `openhands-sdk` + `openhands-tools`): its default agent with LiteLLM's
  `openai/local` at the gateway's `/v1` (README.md), run by tests/agents/openhands_task.py in
  the agent's own Python 3.12. `openhands` streams (`LLM(stream=True)`), so a break has a
  stream to land in; `openhands-unstreamed` is the SDK's default, not streamed.
- aider (PyPI `aider-chat`): `--openai-api-base` the gateway's `/v1`, `--model openai/local`,
  in a git repository of its own (so its flow has its second call: the commit message).
  `aider` takes the edit format aider picks for a model it does not know (`whole`);
  `aider-diff` and `aider-udiff` ask for the other two families.

Each is installed by `make agents` (tests/agents/npm/opencode, .venv-agents/<agent>); the
homes and XDG folders are the run's own, and each agent's traffic elsewhere (updates,
model lists, analytics, telemetry) is off by its documented switches.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import orjson

from tests.agents import aider_format
from tests.agents.harness import (
    INSTALL_HINT,
    OWN_CHECKS,
    PROFILE,
    REPO,
    AgentCommand,
    AgentRun,
    Launch,
    RunContext,
    break_problems,
    register,
    run_problems,
)

NPM = REPO / "tests" / "agents" / "npm"
VENVS = REPO / ".venv-agents"
OPENHANDS_TASK = REPO / "tests" / "agents" / "openhands_task.py"
# LiteLLM's provider/model name for an OpenAI-compatible endpoint (README.md)
LITELLM_MODEL = f"openai/{PROFILE}"
# the gateway runs without auth: any key will do, but the clients insist on one
API_KEY = "sk-unused-by-a-gateway-without-auth"
GIT_USER = "[user]\n\tname = Agent Test\n\temail = agent@example.invalid\n"


@dataclass(frozen=True)
class ChatAgent:
    """An agent of the chat front: the program it needs, its pinned version, its launch."""

    name: str
    program: Path
    version: str
    launch: Launch
    front: str = "chat"

    def launcher(self) -> Launch:
        """The agent's launch; a failure saying how to install it when it is missing."""
        if not self.program.is_file():
            raise AssertionError(f"{self.name} is not installed at {self.program}: {INSTALL_HINT}")
        return self.launch


def xdg(home: Path) -> dict[str, str]:
    """The XDG folders, inside the run's home."""
    return {
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
    }


def _requirement(agent: str) -> str:
    """The `==` version of an agent's top package in tests/agents/requirements/<agent>.txt."""
    first = (REPO / "tests" / "agents" / "requirements" / f"{agent}.txt").read_text().split()[0]
    return first.split("==", 1)[1]


def _npm_pinned(folder: str) -> str:
    manifest = orjson.loads((NPM / folder / "package.json").read_bytes())
    return str(next(iter(manifest["dependencies"].values())))


# ------------------------------------------------------------------------------ opencode


def opencode_config(gateway_url: str) -> str:
    """opencode's configuration: the gateway as an OpenAI-compatible provider."""
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "boundedcode": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "BoundedCode gateway",
                "options": {"baseURL": f"{gateway_url}/v1", "apiKey": API_KEY},
                "models": {PROFILE: {"name": PROFILE, "tool_call": True}},
            }
        },
        "model": f"boundedcode/{PROFILE}",
        "autoupdate": False,
        "share": "disabled",
    }
    return orjson.dumps(config, option=orjson.OPT_INDENT_2).decode() + "\n"


def _opencode(ctx: RunContext) -> AgentCommand:
    binary = NPM / "opencode" / "node_modules" / ".bin" / "opencode"
    env = {
        **xdg(ctx.home),
        # no update check, no models.dev list, no language servers fetched, no sharing
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_SHARE": "1",
    }
    config = ctx.home / ".config" / "opencode" / "opencode.json"
    # `opencode run` puts an argument holding spaces in quotes and escapes the quotes in it
    # ("…\"TEXT\"…"); the prompt goes as words, the way it is typed without quotes
    argv = [str(binary), "run", "--print-logs", "--log-level", "WARN", *ctx.prompt.split(" ")]
    return AgentCommand(argv, env, {config: opencode_config(ctx.gateway_url)})


# ----------------------------------------------------------------------------- OpenHands


def _openhands(stream: bool) -> Launch:
    def launch(ctx: RunContext) -> AgentCommand:
        python = VENVS / "openhands" / "bin" / "python"
        argv = [
            str(python),
            str(OPENHANDS_TASK),
            "--base-url",
            f"{ctx.gateway_url}/v1",
            "--model",
            LITELLM_MODEL,
            "--workspace",
            str(ctx.workspace),
            *(["--stream"] if stream else []),
            ctx.prompt,
        ]
        env = {
            **xdg(ctx.home),
            "OPENAI_API_KEY": API_KEY,
            # LiteLLM's bundled model list instead of the one it fetches
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "OPENHANDS_SUPPRESS_BANNER": "1",
        }
        return AgentCommand(argv, env)

    return launch


# --------------------------------------------------------------------------------- aider

# aider's file for models it does not know (its docs: "Configuring advanced model
# settings"): without it aider fetches LiteLLM's model list at start
AIDER_MODEL_METADATA = {
    LITELLM_MODEL: {
        "max_input_tokens": 32768,
        "max_output_tokens": 4096,
        "input_cost_per_token": 0,
        "output_cost_per_token": 0,
        "litellm_provider": "openai",
        "mode": "chat",
    }
}


def _aider(edit_format: str | None) -> Launch:
    def launch(ctx: RunContext) -> AgentCommand:
        aider = VENVS / "aider" / "bin" / "aider"
        metadata = ctx.home / ".aider.model.metadata.json"
        # a repository of its own, as aider is used: the edit is committed
        subprocess.run(["git", "init", "-q", str(ctx.workspace)], check=True)
        argv = [
            str(aider),
            "--openai-api-base",
            f"{ctx.gateway_url}/v1",
            "--openai-api-key",
            API_KEY,
            "--model",
            LITELLM_MODEL,
            "--model-metadata-file",
            str(metadata),
            *(["--edit-format", edit_format] if edit_format else []),
            "--yes-always",
            "--no-check-update",
            "--no-show-model-warnings",
            "--no-show-release-notes",
            "--analytics-disable",
            "--no-pretty",
            "--no-fancy-input",
            "--message",
            ctx.prompt,
        ]
        env = {**xdg(ctx.home), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        files = {
            metadata: orjson.dumps(AIDER_MODEL_METADATA).decode(),
            ctx.home / ".gitconfig": GIT_USER,
        }
        return AgentCommand(argv, env, files)

    return launch


def aider_problems(run: AgentRun) -> list[str]:
    """What a run of aider got wrong; empty when nothing. aider calls no tools: its run is
    the edit, applied to the file (its lines: the text and a newline), then the commit of
    it with the message the scripted model wrote; the break as for every agent."""
    if run.returncode is None:
        return ["the agent did not finish in time"]
    found = run_problems(run)
    if run.file_text != run.task.text + "\n":
        found.append(f"the file holds {run.file_text!r}")
    if "Applied edit to" not in run.stdout:
        found.append("aider applied no edit")
    workspace = Path(run.task.path).parent
    log = subprocess.run(
        ["git", "-C", str(workspace), "log", "-1", "--format=%s"],
        capture_output=True,
        text=True,
        check=False,
    )
    message = f"feat: Add {Path(run.task.path).name}"
    if log.stdout.strip() != message:
        found.append(f"the last commit is {log.stdout.strip() or log.stderr.strip()!r}")
    return found + break_problems(run)


def _all() -> dict[str, ChatAgent]:
    opencode = NPM / "opencode" / "node_modules" / ".bin" / "opencode"
    python = VENVS / "openhands" / "bin" / "python"
    aider = VENVS / "aider" / "bin" / "aider"
    oc, oh, ai = _npm_pinned("opencode"), _requirement("openhands"), _requirement("aider")
    agents = (
        ChatAgent("opencode", opencode, oc, _opencode),
        ChatAgent("openhands", python, oh, _openhands(stream=True)),
        ChatAgent("openhands-unstreamed", python, oh, _openhands(stream=False)),
        ChatAgent("aider", aider, ai, _aider(None)),
        ChatAgent("aider-diff", aider, ai, _aider("diff")),
        ChatAgent("aider-udiff", aider, ai, _aider("udiff")),
    )
    return {a.name: a for a in agents}


AGENTS = _all()

for _agent in AGENTS.values():
    register(_agent.name, _agent.launcher)
    if _agent.name.startswith("aider"):
        OWN_CHECKS[_agent.name] = aider_problems
# the scripted model answers aider's requests (they carry no tools) in its edit format
aider_format.register()
