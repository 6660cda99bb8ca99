"""A local profile's servers, built from its configuration: the pool, each member's process.

Builds, starts nothing: a managed server is only described here (its command line,
its log, its slot folder, its slot table), and started by the pool.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from boundedcode_gateway import private_files
from boundedcode_gateway.config import GatewayConfig, ModelProfile, PoolServer, ServerSettings
from boundedcode_gateway.llama_server.api import LlamaServerAPI
from boundedcode_gateway.llama_server.flags import (
    ServerCommand,
    kv_layout_args,
    server_command,
    settings_argv,
    slots_of,
)
from boundedcode_gateway.llama_server.launcher import ManagedLlamaServer
from boundedcode_gateway.llama_server.locate import (
    find_llama_server,
    resolve_model_path,
    resolve_server_files,
)
from boundedcode_gateway.llama_server.pool import PoolMember, ServerPool
from boundedcode_gateway.llama_server.slot_files import SlotFiles
from boundedcode_gateway.llama_server.slot_store import SlotStore
from boundedcode_gateway.llama_server.slots import SlotTable
from boundedcode_gateway.pools.server_state import ServerState
from boundedcode_gateway.upstream.http import HttpClient


def server_pool(
    name: str,
    profile: ModelProfile,
    config: GatewayConfig,
    http: HttpClient,
    headers: Callable[[], dict[str, str]],
    store: SlotStore | None = None,
) -> ServerPool | None:
    """A local profile's servers (checked at start-up); None for a cloud API. ``store``:
    the gateway's slot files, where ``prompt_cache.slot_files`` is on."""
    servers = profile.pool_servers() if profile.provider == "local" else ()
    if not servers:
        return None
    several = len(servers) > 1
    members = []
    for i, server in enumerate(servers):
        # a pool's servers are told apart by their place in it
        label = f"{name}[{i}]" if several else name
        where = f"models.{name}.servers[{i}]" if profile.servers is not None else f"models.{name}"
        members.append(_member(label, where, server, config, http, profile, store is not None))
    files = None
    if store is not None and any(m.slot_dir is not None for m in members):
        idle_s = config.prompt_cache.idle_save_s

        def files(api: LlamaServerAPI) -> SlotFiles:
            assert store is not None
            return SlotFiles(name, store, api, idle_s)

    return ServerPool(name, members, profile.routing_policy, http, headers, files)


def _member(
    label: str,
    where: str,
    server: PoolServer,
    config: GatewayConfig,
    http: HttpClient,
    profile: ModelProfile,
    slot_files: bool,
) -> PoolMember:
    settings = server.server or ServerSettings()
    isolated = profile.cache_isolation != "none"
    if server.external_url:
        url = server.external_url.rstrip("/")
        saved_in = settings.slot_save_path if slot_files else None
        return PoolMember(
            ServerState(url_shown(url)),
            url,
            cache_repair=settings.cache_repair,
            slot_dir=Path(saved_in) if saved_in else None,
        )
    assert server.model_path is not None
    binary = find_llama_server(config.llama_server_bin)
    model = str(resolve_model_path(server.model_path, f"{where}.model_path"))
    settings = resolve_server_files(settings, f"{where}.server")

    folder = config.data_path / "llama-server"
    slot_dir = folder / f"{label}.slots" if isolated or slot_files else None
    cache_ram = cache_ram_share(config)

    def command_for_port(port: int) -> ServerCommand:
        if slot_dir is not None:
            private_folder(slot_dir)
        return server_command(
            binary,
            model,
            port,
            label,
            settings,
            slot_dir,
            isolated=isolated,
            cache_ram_mib=cache_ram,
        )

    log_path = folder / f"{label}.log"
    managed = ManagedLlamaServer(
        label, command_for_port, log_path, settings.startup_timeout_s, http
    )
    count = slots_of(settings)
    state = ServerState(label, count)
    slots = SlotTable(count, isolated=isolated) if slot_dir is not None else None
    return PoolMember(
        state,
        None,
        managed,
        settings.cache_repair,
        settings.extra_args,
        slots=slots,
        slot_dir=slot_dir if slot_files else None,
        # llama-server restores a state of another model of the same shape, or of another
        # build, without a word: the files, and the flags that shape the state, tell them
        identity_facts=(
            *file_facts(model),
            *file_facts(binary),
            *kv_layout_args(tuple(settings_argv(settings))),
        ),
    )


def cache_ram_share(config: GatewayConfig) -> int | None:
    """Each managed server's share of ``prompt_cache.ram_mib`` (None: llama-server's own
    default)."""
    total = config.prompt_cache.ram_mib
    if total is None:
        return None
    servers = sum(
        1
        for profile in config.models.values()
        if profile.provider == "local"
        for server in profile.pool_servers()
        if server.model_path
    )
    return total // max(servers, 1)


def file_facts(path: str) -> tuple[str, ...]:
    """What tells a file (a model, a binary) from another at the same path: its size and
    the time it was last changed."""
    try:
        st = Path(path).stat()
    except OSError:
        return (path,)
    return (path, str(st.st_size), str(st.st_mtime_ns))


def private_folder(path: Path) -> None:
    """A folder only the gateway's user can enter (what the server saves of a slot's
    prompt lands there before the gateway moves it to its slot files)."""
    private_files.make_folder(path)
    path.chmod(private_files.FOLDER_MODE)


def url_shown(url: str) -> str:
    """A server's URL without credentials, for records and logs."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, host + port, parts.path, parts.query, parts.fragment))
