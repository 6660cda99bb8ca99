"""Model-profile ``server:`` keys → llama-server's command line and environment (pure).

The table of docs/llama-server.md as data: each key maps to exactly one flag (or one variable of
the server's environment); a key left unset adds nothing, so the server's own
default holds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from boundedcode_gateway.config import ServerSettings
from boundedcode_gateway.llama_server.environment import CLOSED_CORS_ENV
from boundedcode_gateway.pools.server_state import DEFAULT_PARALLEL

LOOPBACK = "127.0.0.1"

# key → flag, for keys whose value is the flag's one argument
VALUE_FLAGS: tuple[tuple[str, str], ...] = (
    ("ctx_checkpoints", "--ctx-checkpoints"),
    ("checkpoint_min_step", "--checkpoint-min-step"),
    ("cache_ram_mib", "--cache-ram"),
    ("cache_reuse", "--cache-reuse"),
    ("ctx_size", "--ctx-size"),
    ("parallel", "--parallel"),
    ("threads", "--threads"),
    ("chat_template_file", "--chat-template-file"),
)

# key → (flag when true, flag when false)
SWITCH_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("reasoning_preserve", "--reasoning-preserve", "--no-reasoning-preserve"),
)

# flags whose value is a secret, llama-server's short spellings among them (-hft is
# --hf-token): hidden wherever the command line is shown
SECRET_FLAGS = frozenset({"-hft", "--hf-token", "--api-key"})
# words that make another flag's value a secret (one that extra_args adds)...
_SECRET_WORDS = ("key", "token", "secret", "password", "passwd")
# ...unless the flag names a file: a path is not the secret (--api-key-file, --ssl-key-file)
_PATH_FLAG_ENDS = ("-file", "-path", "-dir")
HIDDEN = "***"
# the credentials of a URL: scheme://user:password@ (or a token as the user)
_URL_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@]*@")

# key → environment variable of the server process
ENV_KEYS: tuple[tuple[str, str], ...] = (
    # read by ggml's CUDA (and Vulkan, SYCL, CANN) backends; no command-line flag exists
    ("op_offload_min_batch", "GGML_OP_OFFLOAD_MIN_BATCH"),
)


@dataclass(frozen=True, slots=True)
class ServerCommand:
    """What the gateway runs: argv, the variables it sets in the server's environment, and
    the names of the gateway's own variables the server is also given (``pass_env``)."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    pass_env: tuple[str, ...] = ()


def settings_argv(settings: ServerSettings) -> list[str]:
    """The flags for the keys that are set, in the table's order, then ``extra_args``."""
    argv: list[str] = []
    for key, flag in VALUE_FLAGS:
        value = getattr(settings, key)
        if value is not None:
            argv += [flag, str(value)]
    for key, on, off in SWITCH_FLAGS:
        value = getattr(settings, key)
        if value is not None:
            argv.append(on if value else off)
    argv += settings.extra_args
    return argv


# /slots then shows each slot's last prompt and generated text, which the cache keeper
# compares with the next request's rendering to name a cache miss (docs/reasoning.md);
# only to a request with the server's key (docs/security.md)
SLOTS_DEBUG_ENV = {"LLAMA_SERVER_SLOTS_DEBUG": "1"}


def settings_env(settings: ServerSettings) -> dict[str, str]:
    env = {
        var: str(getattr(settings, key))
        for key, var in ENV_KEYS
        if getattr(settings, key) is not None
    }
    return {**SLOTS_DEBUG_ENV, **CLOSED_CORS_ENV, **env}


_PARALLEL_FLAGS = frozenset({"-np", "--parallel"})


def slots_of(settings: ServerSettings) -> int:
    """The server's slot count: ``server.parallel``, else ``-np``/``--parallel`` of its
    extra flags, else what the gateway takes llama-server's own choice to be."""
    return settings.parallel or _extra_parallel(settings.extra_args) or DEFAULT_PARALLEL


def _extra_parallel(args: tuple[str, ...]) -> int | None:
    found: int | None = None
    for i, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        if flag not in _PARALLEL_FLAGS:
            continue
        if not equals:
            value = args[i + 1] if i + 1 < len(args) else ""
        if value.isdigit() and int(value) > 0:
            found = int(value)
    return found


# llama-server's spellings of the one switch its automatic slot count also turns on
_KV_UNIFIED_FLAGS = frozenset({"-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified"})


def fixed_slots_argv(settings: ServerSettings) -> list[str]:
    """The slot count fixed where llama-server would choose it (the gateway pins each
    call to a slot by number, and llama-server wraps a number past its last slot round
    to the first): llama-server's own automatic layout, 4 slots on one KV buffer
    (``--kv-unified``), unless the operator's own flags say otherwise."""
    if settings.parallel is not None or _extra_parallel(settings.extra_args) is not None:
        return []
    argv = ["--parallel", str(DEFAULT_PARALLEL)]
    if not _KV_UNIFIED_FLAGS & {a.partition("=")[0] for a in settings.extra_args}:
        argv.append("--kv-unified")
    return argv


# flags whose values change what a slot's saved state is: a file saved under others is
# not restored (docs/llama-server.md, "Slot files")
KV_LAYOUT_FLAGS = frozenset(
    {
        "-ctk",
        "--cache-type-k",
        "-ctv",
        "--cache-type-v",
        "-fa",
        "--flash-attn",
        "--swa-full",
        "-kvu",
        "--kv-unified",
        "-no-kvu",
        "--no-kv-unified",
        "-c",
        "--ctx-size",
        "-np",
        "--parallel",
        "--rope-scaling",
        "--rope-scale",
        "--rope-freq-base",
        "--rope-freq-scale",
        "--yarn-orig-ctx",
        "-lv",
        "--lora",
        "--lora-scaled",
        "--control-vector",
    }
)


def kv_layout_args(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The flags of ``argv`` (and their values) that change a slot's saved state."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        flag = arg.partition("=")[0]
        if flag in KV_LAYOUT_FLAGS:
            out.append(arg)
            if "=" not in arg and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                out.append(argv[i + 1])
    return tuple(out)


def slot_files_argv(
    settings: ServerSettings, slot_dir: Path, cache_ram_mib: int | None
) -> list[str]:
    """What a server whose slots are saved and restored per conversation runs with
    besides its keys: its slot count fixed, the folder it saves slots to
    (``--slot-save-path``), and its share of the gateway's host-memory prompt cache
    unless ``server.cache_ram_mib`` sets its own."""
    argv = fixed_slots_argv(settings)
    if settings.cache_ram_mib is None and cache_ram_mib is not None:
        argv += ["--cache-ram", str(cache_ram_mib)]
    return [*argv, "--slot-save-path", str(slot_dir)]


def isolation_argv(settings: ServerSettings, slot_dir: Path) -> list[str]:
    """What a server of a profile with ``cache_isolation`` runs with besides its keys: its
    slot count fixed (the gateway pins each call to a slot by number, and llama-server
    wraps a number past its last slot round to the first), no host-memory prompt cache
    (any slot's call may load from it what another slot held), and the folder without
    which llama-server refuses to erase a slot (``--slot-save-path``).

    A slot count left to llama-server is 4 slots sharing one KV buffer, each able to use
    the whole context; the fixed count keeps that (``--kv-unified``) unless the
    operator's own flags say otherwise. Slots of one buffer still hold separate
    sequences: none reads another's."""
    argv = fixed_slots_argv(settings)
    if settings.cache_ram_mib is None:
        argv += ["--cache-ram", "0"]
    return [*argv, "--slot-save-path", str(slot_dir)]


def server_command(
    binary: str,
    model_path: str,
    port: int,
    alias: str,
    settings: ServerSettings,
    slot_dir: Path | None = None,
    *,
    isolated: bool = True,
    cache_ram_mib: int | None = None,
) -> ServerCommand:
    """The full command for one managed server on ``127.0.0.1:port``; ``slot_dir``: the
    server's slot folder, where the profile isolates its prompt cache (``isolated``) or
    its slots are saved per conversation; ``cache_ram_mib``: its share of the gateway's
    host-memory prompt cache."""
    if slot_dir is None:
        own: list[str] = []
        if settings.cache_ram_mib is None and cache_ram_mib is not None:
            own = ["--cache-ram", str(cache_ram_mib)]
    elif isolated:
        own = isolation_argv(settings, slot_dir)
    else:
        own = slot_files_argv(settings, slot_dir, cache_ram_mib)
    argv = [
        binary,
        "--model",
        model_path,
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        # responses then name the profile, not the GGUF path
        "--alias",
        alias,
        "--no-webui",
        *settings_argv(settings),
        *own,
    ]
    return ServerCommand(tuple(argv), settings_env(settings), settings.pass_env)


def is_secret_flag(arg: str) -> bool:
    """Whether ``arg`` is a flag whose value is a key, a token or a password."""
    if not arg.startswith("-"):
        return False
    flag = arg.lower()
    if flag in SECRET_FLAGS:
        return True
    return not flag.endswith(_PATH_FLAG_ENDS) and any(w in flag for w in _SECRET_WORDS)


def shown_argv(argv: tuple[str, ...]) -> tuple[str, ...]:
    """``argv`` as an operator is shown it: the value of each secret flag hidden, whether
    it follows the flag or is joined to it (``--hf-token=…``), and a URL's credentials."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(HIDDEN)
            hide_next = False
            continue
        flag, equals, value = arg.partition("=")
        if equals and flag.startswith("-"):
            out.append(
                flag + "=" + (HIDDEN if is_secret_flag(flag) else _without_credentials(value))
            )
        elif is_secret_flag(arg):
            out.append(arg)
            hide_next = True
        else:
            out.append(_without_credentials(arg))
    return tuple(out)


def _without_credentials(value: str) -> str:
    """A URL (a model's, a proxy's) with what stands before its ``@`` hidden."""
    return _URL_USERINFO.sub(r"\g<1>" + HIDDEN + "@", value)


# flag → whether continuing works after it (the last one of each pair wins)
_FLAGS = {
    "--jinja": ("jinja", True),
    "--no-jinja": ("jinja", False),
    "--skip-chat-parsing": ("parsing", False),
    "--no-skip-chat-parsing": ("parsing", True),
}


def server_flags_continue(argv: Iterable[str]) -> bool:
    """Whether a llama-server run with these arguments can continue a partial answer."""
    works = {"jinja": True, "parsing": True}
    for arg in argv:
        if arg in _FLAGS:
            key, value = _FLAGS[arg]
            works[key] = value
    return all(works.values())
