"""A local profile's servers, built from its configuration: the pool, each member's process.

Builds, starts nothing: a managed server is only described here (its command line,
its log, its slot folder), and started by the pool.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from boundedcode_gateway.config import GatewayConfig, ModelProfile, PoolServer, ServerSettings
from boundedcode_gateway.llama_server.flags import ServerCommand, server_command, slots_of
from boundedcode_gateway.llama_server.launcher import ManagedLlamaServer
from boundedcode_gateway.llama_server.locate import (
    find_llama_server,
    resolve_model_path,
    resolve_server_files,
)
from boundedcode_gateway.llama_server.pool import PoolMember, ServerPool
from boundedcode_gateway.llama_server.slots import SlotTable
from boundedcode_gateway.pools.server_state import ServerState
from boundedcode_gateway.upstream.http import HttpClient


def server_pool(
    name: str,
    profile: ModelProfile,
    config: GatewayConfig,
    http: HttpClient,
    headers: Callable[[], dict[str, str]],
) -> ServerPool | None:
    """A local profile's servers (checked at start-up); None for a cloud API."""
    servers = profile.pool_servers() if profile.provider == "local" else ()
    if not servers:
        return None
    several = len(servers) > 1
    members = []
    for i, server in enumerate(servers):
        # a pool's servers are told apart by their place in it
        label = f"{name}[{i}]" if several else name
        where = f"models.{name}.servers[{i}]" if profile.servers is not None else f"models.{name}"
        members.append(
            _member(label, where, server, config, http, profile.cache_isolation != "none")
        )
    return ServerPool(name, members, profile.routing_policy, http, headers)


def _member(
    label: str,
    where: str,
    server: PoolServer,
    config: GatewayConfig,
    http: HttpClient,
    isolated: bool = False,
) -> PoolMember:
    settings = server.server or ServerSettings()
    if server.external_url:
        url = server.external_url.rstrip("/")
        return PoolMember(ServerState(url_shown(url)), url, cache_repair=settings.cache_repair)
    assert server.model_path is not None
    binary = find_llama_server(config.llama_server_bin)
    model = str(resolve_model_path(server.model_path, f"{where}.model_path"))
    settings = resolve_server_files(settings, f"{where}.server")

    folder = config.data_path / "llama-server"
    slot_dir = folder / f"{label}.slots" if isolated else None

    def command_for_port(port: int) -> ServerCommand:
        if slot_dir is not None:
            private_folder(slot_dir)
        return server_command(binary, model, port, label, settings, slot_dir)

    log_path = folder / f"{label}.log"
    managed = ManagedLlamaServer(
        label, command_for_port, log_path, settings.startup_timeout_s, http
    )
    state = ServerState(label, slots_of(settings))
    slots = SlotTable(slots_of(settings)) if isolated else None
    return PoolMember(state, None, managed, settings.cache_repair, settings.extra_args, slots=slots)


def private_folder(path: Path) -> None:
    """A folder only the gateway's user can enter (what the server may save of a slot's
    prompt lands there; the gateway itself saves nothing)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)


def url_shown(url: str) -> str:
    """A server's URL without credentials, for records and logs."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, host + port, parts.path, parts.query, parts.fragment))
