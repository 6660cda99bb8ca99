"""``boundedcode-gateway llama-server PROFILE --print``: the exact command the gateway would run."""

from __future__ import annotations

import shlex

from boundedcode_gateway.config import GatewayConfig, ServerSettings
from boundedcode_gateway.errors import ConfigError
from boundedcode_gateway.llama_server.flags import ServerCommand, server_command
from boundedcode_gateway.llama_server.launcher import free_port
from boundedcode_gateway.llama_server.locate import (
    find_llama_server,
    resolve_model_path,
    resolve_server_files,
)


def command_for(config: GatewayConfig, name: str, port: int) -> ServerCommand:
    """The command a ``model_path`` profile runs, on ``port``."""
    profile = config.models.get(name)
    if profile is None:
        raise ConfigError(f"models.{name}: no such model profile")
    if not profile.model_path:
        raise ConfigError(f"models.{name}: not a managed server (it has no 'model_path')")
    if profile.replicas is not None:
        raise ConfigError(
            f"models.{name}: 'replicas' runs several servers, each on a port the gateway "
            "chooses; this prints the command of a profile of one server"
        )
    model = resolve_model_path(profile.model_path, f"models.{name}.model_path")
    binary = find_llama_server(config.llama_server_bin)
    settings = resolve_server_files(profile.server or ServerSettings(), f"models.{name}.server")
    isolated = profile.cache_isolation != "none"
    slot_dir = config.data_path / "llama-server" / f"{name}.slots" if isolated else None
    return server_command(binary, str(model), port, name, settings, slot_dir)


def run_print(config: GatewayConfig, name: str) -> int:
    """Print the environment additions and the command line, one shell line each."""
    cmd = command_for(config, name, free_port())
    print("# the port is chosen free at each start")
    print(
        "# each start also sets LLAMA_API_KEY to a fresh random key, and passes on only an "
        "allow-list of the gateway's environment (docs/security.md)"
    )
    for var, value in cmd.env.items():
        print(f"export {var}={shlex.quote(value)}")
    print(shlex.join(cmd.argv))
    return 0
