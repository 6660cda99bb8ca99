"""The npm agents, each set up as README.md and docs/fronts.md say, headless.

Claude Code (two releases users have: what npm gives on node 20, and the newest) and
qwen-code speak the Messages front; Codex speaks the Responses front with docs/fronts.md's
`config.toml`. Each is installed by `make agents` into tests/agents/npm/<name>/ from its
package-lock.json. Their own traffic elsewhere (updates, telemetry, error reports) is
turned off by their documented switches; this machine reaches only 127.0.0.1 anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.agents.harness import (
    INSTALL_HINT,
    PROFILE,
    REPO,
    AgentCommand,
    Launch,
    RunContext,
    register,
)

NPM = REPO / "tests" / "agents" / "npm"


@dataclass(frozen=True)
class NodeAgent:
    """An agent from npm: its folder under tests/agents/npm, its program, how to run it."""

    name: str  # also the folder
    front: str
    program: str
    launch: Launch

    @property
    def binary(self) -> Path:
        return NPM / self.name / "node_modules" / ".bin" / self.program

    def version(self) -> str:
        return self.name.rsplit("-", 1)[-1] if self.name[-1].isdigit() else _pinned(self.name)

    def launcher(self) -> Launch:
        """The agent's launch; a failure saying how to install it when it is missing."""
        if not self.binary.is_file():
            raise AssertionError(f"{self.name} is not installed at {self.binary}: {INSTALL_HINT}")
        return self.launch


def _pinned(name: str) -> str:
    import orjson

    manifest = orjson.loads((NPM / name / "package.json").read_bytes())
    return str(next(iter(manifest["dependencies"].values())))


def _claude(folder: str) -> Launch:
    def launch(ctx: RunContext) -> AgentCommand:
        binary = NPM / folder / "node_modules" / ".bin" / "claude"
        config = ctx.home / ".claude"
        env = {
            # docs/fronts.md: the gateway's address and profile, its background calls too
            "ANTHROPIC_BASE_URL": ctx.gateway_url,
            "ANTHROPIC_MODEL": PROFILE,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": PROFILE,
            "ANTHROPIC_AUTH_TOKEN": "sk-ant-unused-by-a-gateway-without-auth",
            "CLAUDE_CONFIG_DIR": str(config),
            # no updates, telemetry, error reports or other calls elsewhere
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            # its documented switch for running with all permissions as root in a sandbox
            "IS_SANDBOX": "1",
        }
        argv = [str(binary), "-p", ctx.prompt, "--dangerously-skip-permissions"]
        return AgentCommand(argv, env)

    return launch


def _codex(ctx: RunContext) -> AgentCommand:
    binary = NPM / "codex" / "node_modules" / ".bin" / "codex"
    codex_home = ctx.home / ".codex"
    # docs/fronts.md's config.toml, with the gateway's address
    config = (
        f'model = "{PROFILE}"\n'
        'model_provider = "boundedcode"\n\n'
        "[model_providers.boundedcode]\n"
        'name = "BoundedCode gateway"\n'
        f'base_url = "{ctx.gateway_url}/v1"\n'
        'wire_api = "responses"\n'
    )
    argv = [
        str(binary),
        "exec",
        "--skip-git-repo-check",
        "--sandbox",
        "workspace-write",
        "--color",
        "never",
        ctx.prompt,
    ]
    env = {"CODEX_HOME": str(codex_home)}
    return AgentCommand(argv, env, {codex_home / "config.toml": config})


def _qwen(ctx: RunContext) -> AgentCommand:
    binary = NPM / "qwen-code" / "node_modules" / ".bin" / "qwen"
    env = {
        "ANTHROPIC_BASE_URL": ctx.gateway_url,
        "ANTHROPIC_API_KEY": "sk-ant-unused-by-a-gateway-without-auth",
        "ANTHROPIC_MODEL": PROFILE,
        # no usage statistics, telemetry or update checks
        "QWEN_USAGE_STATISTICS_ENABLED": "0",
        "QWEN_TELEMETRY_ENABLED": "0",
    }
    settings = '{"general": {"enableAutoUpdate": false}}\n'
    argv = [str(binary), "--auth-type", "anthropic", "-m", PROFILE, "-p", ctx.prompt, "--yolo"]
    return AgentCommand(argv, env, {ctx.home / ".qwen" / "settings.json": settings})


AGENTS = {
    a.name: a
    for a in (
        NodeAgent("claude-code-2.1.332", "messages", "claude", _claude("claude-code-2.1.332")),
        NodeAgent("claude-code-2.1.197", "messages", "claude", _claude("claude-code-2.1.197")),
        NodeAgent("codex", "responses", "codex", _codex),
        NodeAgent("qwen-code", "messages", "qwen", _qwen),
    )
}

for _agent in AGENTS.values():
    register(_agent.name, _agent.launcher)
