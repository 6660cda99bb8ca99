"""The gateway's configuration: the YAML file, its schema and its validation.

Owns loading and checking the file; it must not open connections or read API
keys (those are read from the environment when a call needs them).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from boundedcode_gateway.errors import ConfigError, InvalidApiKeyConfig
from boundedcode_gateway.locations import (
    LedgerLocation,
    PostgresLocation,
    parse_ledger_url,
    parse_postgres_url,
)
from boundedcode_gateway.provider_kinds import KINDS, ProviderKind, kinds_that

ReasoningHistory = Literal["auto", "keep", "drop"]
ThinkingMode = Literal["enabled", "adaptive", "off"]
# how a call picks one of a profile's several servers (docs/scaling.md)
Routing = Literal["affinity", "least_busy", "round_robin"]
# what a local profile does with a media part that names a URL, which its server would
# fetch (docs/security.md#media-from-urls): refuse it, or pass it on
RemoteMedia = Literal["refuse", "pass"]

# whose calls may reuse each other's prompt cache on a local profile's servers: anyone's
# (none), only the same caller key's (key), only the same task's (task); docs/security.md
CacheIsolation = Literal["none", "key", "task"]

# the name the embedded default configuration goes by in messages
EMBEDDED_DEFAULT = "<embedded default>"
# the call log's file name inside the data directory
CALLS_FILE = "calls.jsonl"
_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?\.?")
ThinkingLevel = Literal["minimal", "low", "medium", "high", "xhigh", "max"]
# what ``api_key_env`` may hold: the name of an environment variable, never a key
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# what an API key may hold to be sent in a header: visible ASCII, inner spaces or tabs
# (no line break that would end the header, no control or non-ASCII character)
HEADER_SAFE_KEY = re.compile(r"[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*")


# what the gateway gives a managed llama-server itself at each start (its key, its CORS):
# neither ``server.pass_env`` nor ``server.extra_args`` may set them another way
SERVER_OWN_ENV = (
    "LLAMA_API_KEY",
    "LLAMA_ARG_API_KEY_FILE",
    "LLAMA_ARG_CORS_ORIGINS",
    "LLAMA_ARG_CORS_CREDENTIALS",
)
SERVER_OWN_FLAGS = (
    "--api-key",
    "--api-key-file",
    "--cors-origins",
    "--cors-credentials",
    "--no-cors-credentials",
)
# what the gateway sets on a server of a profile with ``cache_isolation`` (a fixed slot
# count, no host-memory prompt cache shared by the slots, the folder slot erasing needs)
ISOLATION_OWN_FLAGS = (
    "-np",
    "--parallel",
    "-cram",
    "--cache-ram",
    "--cache-idle-slots",
    "--slot-save-path",
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ServerSettings(_Strict):
    """``server:`` of a managed llama.cpp profile: each key one flag; unset keeps the default."""

    ctx_checkpoints: int | None = Field(default=None, ge=0)
    checkpoint_min_step: int | None = Field(default=None, ge=0)
    cache_ram_mib: int | None = Field(default=None, ge=-1)
    reasoning_preserve: bool | None = None
    op_offload_min_batch: int | None = Field(default=None, ge=1)
    cache_reuse: int | None = Field(default=None, ge=0)
    ctx_size: int | None = Field(default=None, ge=0)
    parallel: int | None = Field(default=None, ge=1)
    threads: int | None = Field(default=None, ge=1)
    chat_template_file: str | None = None
    extra_args: tuple[str, ...] = ()
    # names of the gateway's environment variables the server is also given (it gets
    # only an allow-list otherwise: docs/security.md)
    pass_env: tuple[str, ...] = ()
    startup_timeout_s: float = Field(default=300.0, gt=0)
    # re-evaluate each conversation's canonical rendering after an answer (docs/reasoning.md);
    # with slot_save_path, the keys that also apply to a server the gateway does not run
    cache_repair: bool = True
    # a server the gateway does not run: the folder it was started with as
    # ``--slot-save-path``, on this host, for its slots to be saved per conversation
    # (docs/llama-server.md, "Slot files"); the gateway sets its own servers' folder
    slot_save_path: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _list_to_tuple(cls, data: Any) -> Any:
        # YAML gives lists; strict mode wants the declared tuple
        for key in ("extra_args", "pass_env"):
            if isinstance(data, dict) and isinstance(data.get(key), list):
                data = {**data, key: tuple(data[key])}
        return data

    @field_validator("extra_args")
    @classmethod
    def _no_own_flags(cls, args: tuple[str, ...]) -> tuple[str, ...]:
        own = sorted({a.partition("=")[0] for a in args} & set(SERVER_OWN_FLAGS))
        if own:
            raise ValueError(
                f"{', '.join(own)}: the gateway gives each server it runs a fresh key and "
                "closed CORS at every start; these flags would replace them"
            )
        return args

    @field_validator("pass_env")
    @classmethod
    def _env_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not the name of an environment variable")
            if name in SERVER_OWN_ENV:
                raise ValueError(f"{name} is set by the gateway at each start of the server")
        return names


def _check_server_keys(
    external_url: str | None, model_path: str | None, server: ServerSettings | None
) -> None:
    """``server:`` flags need a server the gateway runs; ``cache_repair`` applies to any,
    ``slot_save_path`` to a server the gateway does not run."""
    if server is not None and not model_path:
        flags = server.model_fields_set - {"cache_repair", "slot_save_path"}
        if flags:
            raise ValueError(
                "'server' settings other than 'cache_repair' and 'slot_save_path' apply only "
                f"to a managed server ('model_path'), not: {', '.join(sorted(flags))}"
            )
    if server is not None and model_path and server.slot_save_path is not None:
        raise ValueError(
            "'server.slot_save_path' is for a server the gateway does not run: it gives the "
            "servers it runs a slot folder under data_dir itself"
        )


class PoolServer(_Strict):
    """One server of a local profile: a running one (``external_url``) or one the gateway
    runs (``model_path``, with the same ``server:`` keys as a profile). An entry under
    ``servers:``, and the normal form ``ModelProfile.pool_servers`` gives every profile."""

    external_url: str | None = None
    model_path: str | None = None
    server: ServerSettings | None = None

    @model_validator(mode="after")
    def _check_one_server(self) -> PoolServer:
        if bool(self.external_url) == bool(self.model_path):
            raise ValueError(
                "each server needs exactly one of 'external_url' (a running server) "
                "or 'model_path' (a GGUF file the gateway serves with llama-server)"
            )
        _check_server_keys(self.external_url, self.model_path, self.server)
        return self


class RetrySettings(_Strict):
    """``retry:`` of a profile: the most a call may be resent, in attempts and seconds."""

    max_attempts: int = Field(default=4, ge=1)
    max_total_s: float = Field(default=60.0, gt=0)


class ThinkingSettings(_Strict):
    """``thinking:`` of an Anthropic or Gemini profile: how the model reasons unless the caller
    sends ``reasoning_effort``."""

    mode: ThinkingMode = "enabled"
    # Anthropic's budget_tokens (manual mode), Gemini's thinkingBudget
    budget_tokens: int | None = Field(default=None, ge=-1)
    # Anthropic's output_config.effort (adaptive mode), Gemini 3's thinkingLevel
    level: ThinkingLevel | None = None


class PriceSettings(_Strict):
    """``price:`` of a profile, in USD: what a call's tokens (and a local server's time) cost."""

    input_per_mtok: float = Field(ge=0)
    # cached prompt tokens; unset: charged as input
    cached_input_per_mtok: float | None = Field(default=None, ge=0)
    output_per_mtok: float = Field(ge=0)
    # local servers: what one second of the server's work costs (prefill plus decode)
    gpu_second: float | None = Field(default=None, ge=0)


BudgetPeriod = Literal["day", "lifetime"]
# who shares a task's stored reasoning and the seals given back (docs/security.md)
ReasoningSharing = Literal["caller", "task"]


class BudgetSettings(_Strict):
    """A budget: the most that may be spent per UTC day or over the holder's lifetime."""

    max_cost_usd: float | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_evaluated_tokens: int | None = Field(default=None, ge=1)
    per: BudgetPeriod = "day"

    @model_validator(mode="after")
    def _check_some_limit(self) -> BudgetSettings:
        limits = (self.max_cost_usd, self.max_tokens, self.max_evaluated_tokens)
        if all(limit is None for limit in limits):
            raise ValueError(
                "a budget needs at least one of 'max_cost_usd', 'max_tokens' "
                "or 'max_evaluated_tokens'"
            )
        return self


class WindowSettings(_Strict):
    """At most ``limit`` in any ``window_s`` seconds (a sliding window)."""

    limit: int = Field(ge=1)
    window_s: float = Field(default=60.0, gt=0, le=86_400)


class RateLimitSettings(_Strict):
    """What one holder (a caller, a task, a profile) may send: requests and tokens per
    window, and calls at once (docs/budgets.md, "Rate and concurrency limits")."""

    requests: WindowSettings | None = None
    # prompt plus completion tokens, counted when each call ends
    tokens: WindowSettings | None = None
    # prompt tokens alone (input), and completion tokens alone (output), likewise
    input_tokens: WindowSettings | None = None
    output_tokens: WindowSettings | None = None
    # the prompt tokens the servers evaluated, counted when each call ends
    evaluated_tokens: WindowSettings | None = None
    # calls in flight at once; more wait their turn (``rate_limits.max_wait_s``)
    in_flight: int | None = Field(default=None, ge=1)
    # of a profile's calls in flight, what one caller may hold: below a local server's
    # slots, so another caller always finds one
    in_flight_per_caller: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _check_some_limit(self) -> RateLimitSettings:
        limits = (
            self.requests,
            self.tokens,
            self.input_tokens,
            self.output_tokens,
            self.evaluated_tokens,
            self.in_flight,
            self.in_flight_per_caller,
        )
        if all(v is None for v in limits):
            raise ValueError(
                "a rate limit needs at least one of 'requests', 'tokens', 'input_tokens', "
                "'output_tokens', 'evaluated_tokens', 'in_flight' or 'in_flight_per_caller'"
            )
        return self


class RateLimitsSettings(_Strict):
    """``rate_limits:``: per caller (each key and each task token on its own; a key's own
    ``rate_limits`` instead), per task, per profile; how long a call waits for a place."""

    per_caller: RateLimitSettings | None = None
    per_task: RateLimitSettings | None = None
    profiles: dict[str, RateLimitSettings] = Field(default_factory=dict)
    # calls waiting for a place of one concurrency limit; more are refused at once
    max_waiting: int = Field(default=256, ge=0)
    # the longest a call waits for a place before it is refused
    max_wait_s: float = Field(default=30.0, gt=0)
    # windows several gateways share (a PostgreSQL database) when it does not answer:
    # admit calls uncounted (the default: a rate is not money), or refuse them
    when_store_down: Literal["fail_closed", "fail_open"] = "fail_open"

    @property
    def configured(self) -> bool:
        return bool(self.per_caller or self.per_task or self.profiles)


class KeySettings(_Strict):
    """One caller key under ``auth.keys``: its name, the SHA-256 of the key, what it may do."""

    name: str = Field(min_length=1, max_length=64)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    models: tuple[str, ...] = Field(min_length=1)
    admin: bool = False
    budget: BudgetSettings | None = None
    # this key's own rate limits, instead of ``rate_limits.per_caller``
    rate_limits: RateLimitSettings | None = None

    @model_validator(mode="before")
    @classmethod
    def _list_to_tuple(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("models"), list):
            data = {**data, "models": tuple(data["models"])}
        return data


# the longest a task token may live (``auth.max_token_ttl_s``): a day covers a working
# session or a night's agent run, and bounds how long a leaked token is any use
DEFAULT_MAX_TOKEN_TTL_S = 86_400


class AuthSettings(_Strict):
    """``auth:``: the caller keys, and where the token secret comes from (an environment
    variable, or a file read again on every reload), and how long a token may live."""

    token_secret_env: str | None = None
    token_secret_file: str | None = Field(default=None, min_length=1)
    max_token_ttl_s: int = Field(default=DEFAULT_MAX_TOKEN_TTL_S, ge=1)
    keys: tuple[KeySettings, ...] = ()

    @property
    def takes_tokens(self) -> bool:
        """Whether task tokens are accepted: a token secret is configured."""
        return self.token_secret_env is not None or self.token_secret_file is not None

    @model_validator(mode="before")
    @classmethod
    def _list_to_tuple(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("keys"), list):
            data = {**data, "keys": tuple(data["keys"])}
        return data

    @model_validator(mode="after")
    def _check_keys(self) -> AuthSettings:
        if self.token_secret_env is not None and self.token_secret_file is not None:
            # two sources of one secret: which one signs would be a guess
            raise ValueError("give 'token_secret_env' or 'token_secret_file', not both")
        if not self.keys and not self.takes_tokens:
            # an auth: that admits no one is a mistake, not a locked door
            raise ValueError(
                "'auth' needs at least one entry under 'keys', a 'token_secret_env' "
                "or a 'token_secret_file'"
            )
        for field in ("name", "sha256"):
            seen: set[str] = set()
            for key in self.keys:
                value = getattr(key, field)
                if value in seen:
                    raise ValueError(f"two keys have the same {field} {value!r}")
                seen.add(value)
        return self


class BudgetsSettings(_Strict):
    """``budgets:``: limits that apply to each task id on its own, and what a call is
    taken to spend at most where it does not say (its reservation, docs/budgets.md)."""

    task: BudgetSettings | None = None
    # the answer's tokens a call without max_tokens (and a profile without its own cap)
    # holds of a budget while it runs
    reserve_output_tokens: int = Field(default=4096, ge=1)
    # the seconds of a server's work a call holds, where a profile is priced per second
    reserve_call_s: float = Field(default=60.0, gt=0)
    # budgets several gateways share (a PostgreSQL ledger) when its database does not
    # answer: refuse calls (the default: money is not spent blind), or send them unheld
    when_store_down: Literal["fail_closed", "fail_open"] = "fail_closed"


class LimitsSettings(_Strict):
    """``limits:``: what a caller's connection may hold and for how long."""

    # a kept-alive connection between requests, and a body that stops arriving
    idle_timeout_s: float = Field(default=30.0, gt=0)
    # from the connection's start (or a request's first byte) to the end of its headers
    header_timeout_s: float = Field(default=10.0, gt=0)
    # names the gateway is reached by besides loopback and its listening address (the
    # Host and Origin checks, docs/security.md)
    allowed_hosts: tuple[str, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _list_to_tuple(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("allowed_hosts"), list):
            data = {**data, "allowed_hosts": tuple(data["allowed_hosts"])}
        return data

    @model_validator(mode="after")
    def _check_hosts(self) -> LimitsSettings:
        for host in self.allowed_hosts:
            if not (_HOST_NAME.fullmatch(host) or _is_ip_address(host.strip("[]"))):
                raise ValueError(
                    f"allowed_hosts: {host!r} is not a host name or an IP address "
                    "(no scheme, port or path)"
                )
        return self

    # the request line and headers together; more is a 431
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    # request bodies over 1 MiB being parsed at once (off the loop); more wait their turn
    max_parsing_mib: float = Field(default=32.0, gt=0)
    # a request body: once it has run body_grace_s it must have averaged at least
    # min_body_rate_kib_s, and be whole within body_grace_s + its length at that rate
    # (a chunked one: max_body_mib's), never later than max_body_s after it began
    body_grace_s: float = Field(default=5.0, gt=0)
    min_body_rate_kib_s: float = Field(default=64.0, gt=0)
    max_body_s: float = Field(default=60.0, gt=0)
    # connections open at once; one more is answered 503 as it opens and closed
    max_connections: int = Field(default=512, ge=1)
    # bytes of request bodies being read at once, counted as they arrive; a body that
    # would pass it while others are read is answered 503 (one alone is always read)
    max_reading_mib: float = Field(default=48.0, gt=0)

    @model_validator(mode="after")
    def _check_body_times(self) -> LimitsSettings:
        if self.body_grace_s > self.max_body_s:
            raise ValueError(
                f"body_grace_s ({self.body_grace_s:g}) exceeds max_body_s "
                f"({self.max_body_s:g}): no body could run its grace"
            )
        return self

    @property
    def max_reading_bytes(self) -> int:
        return int(self.max_reading_mib * 1024 * 1024)

    @property
    def min_body_rate(self) -> float:
        """``min_body_rate_kib_s`` in bytes a second."""
        return self.min_body_rate_kib_s * 1024

    @property
    def max_parsing_bytes(self) -> int:
        return int(self.max_parsing_mib * 1024 * 1024)


class RetentionSettings(_Strict):
    """``retention:``: how much of each task the gateway keeps, in memory and on disk."""

    # task folders nothing was written to for this long are removed (at start, then daily)
    task_days: float | None = Field(default=None, gt=0)
    # calls.jsonl is rotated once it reaches this size (calls.jsonl.1, .2, …)
    call_log_mib: float | None = Field(default=None, gt=0)
    # rotated call logs kept; the oldest beyond them is deleted
    call_log_files: int = Field(default=4, ge=1)
    # per-task state in memory (history digests, previous calls, loaded reasoning): at most
    # this many entries each, least recently used forgotten first
    tasks_in_memory: int = Field(default=4096, ge=1)
    # ...and none kept once idle this long (null: no limit)
    task_idle_s: float | None = Field(default=86400.0, gt=0)

    @property
    def call_log_bytes(self) -> int | None:
        return None if self.call_log_mib is None else int(self.call_log_mib * 1024 * 1024)


class PromptCacheSettings(_Strict):
    """``prompt_cache:``: each conversation's llama-server slot saved to a file and
    restored wherever its next call goes, and the host-memory prompt cache of the
    servers the gateway runs (docs/llama-server.md, "Slot files")."""

    # save and restore slots per conversation (managed llama.cpp servers, and those
    # the gateway does not run that name their server.slot_save_path)
    slot_files: bool = True
    # the slot files of the whole gateway at most; the least recently used go first
    disk_mib: float = Field(default=8192.0, gt=0)
    # a conversation's slot idle this long is saved (one a restart would lose)
    idle_save_s: float = Field(default=30.0, gt=0)
    # the host-memory prompt cache (``--cache-ram``) of all the servers the gateway runs
    # together, shared out evenly; a server's own server.cache_ram_mib wins; null leaves
    # each server at llama-server's default (8 GiB)
    ram_mib: int | None = Field(default=4096, ge=0)

    @property
    def disk_bytes(self) -> int:
        return int(self.disk_mib * 1024 * 1024)


class ReasoningSettings(_Strict):
    """``reasoning:``: who shares what the gateway keeps of a task's reasoning, and for how
    long what it hands callers to give back stays good (docs/security.md, "Stored
    reasoning, signatures and seals")."""

    # caller: each caller key its own (a task's tokens one together); task: everyone on
    # the task, as one caller
    shared_by: ReasoningSharing = "caller"
    # a thinking block's signature or a reasoning item's seal older than this is refused
    seal_max_age_days: float = Field(default=30.0, gt=0, le=3650)

    @property
    def seal_max_age_s(self) -> int:
        return int(self.seal_max_age_days * 86400)


class MeteringSettings(_Strict):
    """``metering:``: whether calls are recorded, and whether an answer waits for its record.

    ``metering: true`` / ``false`` is short for ``{enabled: true}`` / ``{enabled: false}``.
    """

    # false: no call log, no ledger (what metering costs, measured)
    enabled: bool = True
    # true: a call's record is written before the caller sees its answer end
    sync: bool = False
    # records kept in memory for a PostgreSQL ledger that went away, written once it is
    # back; past this many the oldest are dropped (and counted)
    ledger_buffer_records: int = Field(default=100_000, ge=1)


class ModelProfile(_Strict):
    """One entry under ``models:``: where a model name is sent and how."""

    provider: ProviderKind
    model: str | None = None
    external_url: str | None = None
    model_path: str | None = None
    server: ServerSettings | None = None
    # several servers of the model instead of one (docs/scaling.md)
    servers: tuple[PoolServer, ...] | None = None
    # as many servers of ``model_path``, each with ``server:``...
    replicas: int | None = Field(default=None, ge=1)
    # ...and, for replica i, the flags of entry i after ``server.extra_args``
    replica_extra_args: tuple[tuple[str, ...], ...] | None = None
    # unset: affinity (only for a profile of several servers)
    routing: Routing | None = None
    # unset: refuse (``local`` only: a cloud provider fetches from its own network)
    remote_media: RemoteMedia | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    reasoning_history: ReasoningHistory | None = None
    retry: RetrySettings = RetrySettings()
    thinking: ThinkingSettings | None = None
    # the answer's token limit when the caller sets none (Anthropic requires one)
    max_tokens: int | None = Field(default=None, ge=1)
    # the ``anthropic-version`` an Anthropic profile's requests name (unset: the newest)
    anthropic_version: str | None = None
    price: PriceSettings | None = None
    # whose calls may reuse each other's prompt cache (local profiles the gateway runs)
    cache_isolation: CacheIsolation = "none"

    # The pool keys are checked one by one, each against the keys declared before it, so
    # a message points at the key's own line; keys of a profile that is not ``local`` are
    # left to ``_check_provider_keys``, which names the provider.

    @field_validator("servers", mode="before")
    @classmethod
    def _check_servers(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return value
        if not isinstance(value, list):
            raise ValueError(
                "'servers' is a list of servers, each with 'external_url' or 'model_path'"
            )
        if not value:
            raise ValueError("'servers' lists one or more servers")
        if _is_local(info):
            single = [k for k in ("external_url", "model_path") if info.data.get(k)]
            if single:
                raise ValueError(
                    f"'servers' lists every server of the profile: make '{single[0]}' one "
                    "of its entries, or remove 'servers'"
                )
            if info.data.get("server") is not None:
                raise ValueError(
                    "with 'servers', give the 'server' settings in each entry that needs "
                    "them, not in the profile"
                )
        return tuple(value)  # strict mode wants the declared tuple

    @field_validator("servers")
    @classmethod
    def _check_distinct_urls(
        cls, value: tuple[PoolServer, ...] | None
    ) -> tuple[PoolServer, ...] | None:
        seen: dict[str, int] = {}
        for i, entry in enumerate(value or ()):
            if not entry.external_url:
                continue
            url = entry.external_url.rstrip("/")
            if url in seen:
                raise ValueError(
                    f"entries {seen[url]} and {i} are the same server ({entry.external_url})"
                )
            seen[url] = i
        return value

    @field_validator("replicas")
    @classmethod
    def _check_replicas(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and _is_local(info) and not info.data.get("model_path"):
            raise ValueError(
                "'replicas' goes with 'model_path' (that many servers of it, run by the "
                "gateway); servers you run are listed under 'servers'"
            )
        return value

    @field_validator("replica_extra_args", mode="before")
    @classmethod
    def _check_replica_extra_args(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return value
        if not isinstance(value, list) or not all(isinstance(a, list) for a in value):
            raise ValueError(
                "give one list of flags per replica, e.g. [[--device, CUDA0], [--device, CUDA1]]"
            )
        # absent: 'replicas' itself was refused, and that is the message
        if _is_local(info) and "replicas" in info.data:
            replicas = info.data["replicas"]
            if replicas is None:
                raise ValueError(
                    "'replica_extra_args' needs 'replicas': one list of flags per replica"
                )
            if len(value) != replicas:
                raise ValueError(
                    f"{len(value)} list(s) of flags for {replicas} replica(s); give one per "
                    "replica ([] for none)"
                )
        return tuple(tuple(a) for a in value)

    @field_validator("routing")
    @classmethod
    def _check_routing(cls, value: Routing | None, info: ValidationInfo) -> Routing | None:
        if value is None or not _is_local(info):
            return value
        servers = info.data.get("servers")
        count = len(servers) if servers is not None else info.data.get("replicas") or 1
        if count < 2:
            raise ValueError(
                "'routing' chooses among several servers and this profile has one; "
                "give it 'servers' or 'replicas' (2 or more), or remove 'routing'"
            )
        return value

    @field_validator("api_key_env")
    @classmethod
    def _check_env_name(cls, value: str | None) -> str | None:
        # the message never repeats the value: a key pasted here must not reach a log
        if value is not None and not ENV_NAME.fullmatch(value):
            raise ValueError(
                "must name an environment variable (letters, digits and '_', not starting "
                "with a digit) that holds the key, not hold the key itself"
            )
        return value

    @field_validator("anthropic_version", mode="before")
    @classmethod
    def _check_anthropic_version(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return value
        # YAML reads an unquoted 2026-10-21 as a date
        if isinstance(value, datetime.date):
            value = value.isoformat()
        provider = info.data.get("provider")
        if not isinstance(provider, str):  # the provider was refused, and that is the message
            return value
        versions = KINDS[provider].anthropic_versions
        if not versions:
            raise ValueError(
                f"'anthropic_version' is only for provider "
                f"{_quoted(kinds_that('anthropic_versions'))}, not {provider!r}"
            )
        if value not in versions:
            raise ValueError(
                f"{value!r} is not an Anthropic API version the gateway speaks; use "
                f"{_quoted(list(versions), 'or')} (unset: {versions[0]}, the newest)"
            )
        return value

    @model_validator(mode="after")
    def _check_provider_keys(self) -> ModelProfile:
        rules = KINDS[self.provider]
        if not rules.takes_thinking and (self.thinking or self.max_tokens):
            raise ValueError(
                f"'thinking' and 'max_tokens' are only for providers "
                f"{_quoted(kinds_that('takes_thinking'))}, not {self.provider!r}"
            )
        if rules.local:
            self._check_local()
            self._check_isolation()
        elif self.cache_isolation != "none":
            raise ValueError(
                f"'cache_isolation' is only for provider {_quoted(kinds_that('local'))}: "
                f"{self.provider!r} keeps its prompt cache per upstream account, which the "
                "gateway cannot divide; give each group of callers a profile with an API key "
                "of its own instead (docs/security.md)"
            )
        elif set_keys := [k for k in _LOCAL_KEYS if getattr(self, k) is not None]:
            raise ValueError(
                f"{_quoted(set_keys)} {'are' if len(set_keys) > 1 else 'is'} only for provider "
                f"{_quoted(kinds_that('local'))}, not {self.provider!r}"
            )
        if rules.needs_base_url and not self.base_url:
            raise ValueError(f"missing required key 'base_url' for provider {self.provider!r}")
        if rules.needs_api_key and not self.api_key_env:
            raise ValueError(f"missing required key 'api_key_env' for provider {self.provider!r}")
        return self

    def _check_local(self) -> None:
        given = [bool(self.external_url), bool(self.model_path), self.servers is not None]
        if sum(given) != 1:
            raise ValueError(
                "provider 'local' needs exactly one of 'external_url' (a running server), "
                "'model_path' (a GGUF file the gateway serves with llama-server) or "
                "'servers' (several servers of the model)"
            )
        if self.base_url:
            raise ValueError("'base_url' is not used by provider 'local'; use 'external_url'")
        _check_server_keys(self.external_url, self.model_path, self.server)

    def _check_isolation(self) -> None:
        """Isolation holds only where the gateway sets each server's flags itself."""
        if self.cache_isolation == "none":
            return
        for server in self.pool_servers():
            if server.external_url:
                raise ValueError(
                    "'cache_isolation' needs servers the gateway runs ('model_path'): it "
                    "cannot tell whether a server it does not run shares a host-memory "
                    "prompt cache between its slots"
                )
            settings = server.server or ServerSettings()
            if settings.cache_ram_mib not in (None, 0):
                raise ValueError(
                    "with 'cache_isolation', 'server.cache_ram_mib' must be 0 or unset: the "
                    "host-memory prompt cache is shared by every slot of a server"
                )
            own = sorted({a.partition("=")[0] for a in settings.extra_args})
            taken = [a for a in own if a in ISOLATION_OWN_FLAGS]
            if taken:
                raise ValueError(
                    f"{', '.join(taken)}: with 'cache_isolation' the gateway sets the slot "
                    "count, the prompt cache and the slot folder itself (set the slot count "
                    "with 'server.parallel')"
                )

    def pool_servers(self) -> tuple[PoolServer, ...]:
        """The profile's servers in one form, whichever keys name them: one for
        ``external_url`` or ``model_path``, ``replicas`` of ``model_path`` (each with its
        ``replica_extra_args`` after ``server.extra_args``), or the ``servers`` entries.
        Empty for a provider other than ``local``."""
        if self.servers is not None:
            return self.servers
        if self.external_url:
            return (PoolServer(external_url=self.external_url, server=self.server),)
        if not self.model_path:
            return ()
        if self.replicas is None:
            return (PoolServer(model_path=self.model_path, server=self.server),)
        settings = self.server or ServerSettings()
        extra = self.replica_extra_args or ((),) * self.replicas
        return tuple(
            PoolServer(
                model_path=self.model_path,
                server=settings.model_copy(update={"extra_args": (*settings.extra_args, *args)}),
            )
            for args in extra
        )

    @property
    def takes_media_urls(self) -> bool:
        """Whether a media part may name a URL for the upstream to fetch: a cloud
        provider's own network fetches it; a local profile's server, on this host, only
        where the profile says ``remote_media: pass``."""
        if not KINDS[self.provider].local:
            return True
        return self.remote_media == "pass"

    @property
    def routing_policy(self) -> Routing:
        """How a call picks one of the profile's servers (affinity unless set)."""
        return self.routing or "affinity"

    @property
    def upstream_base_url(self) -> str:
        """The URL that ``/chat/completions`` (or the provider's path) is appended to."""
        if self.external_url:
            return self.external_url.rstrip("/") + "/v1"
        url = self.base_url or KINDS[self.provider].default_base_url
        return url.rstrip("/")

    @property
    def api_version(self) -> str | None:
        """The API version the profile's requests name: its ``anthropic_version``, else the
        newest its kind speaks; None for a kind without versions."""
        versions = KINDS[self.provider].anthropic_versions
        return self.anthropic_version or (versions[0] if versions else None)

    def _key_in_environment(self) -> str | None:
        if not self.api_key_env:
            return None
        return os.environ.get(self.api_key_env) or None

    def api_key(self) -> str | None:
        """The key from the environment variable the profile names, if set.

        A key a header cannot carry (a line break would end the header and start
        another) is refused at call time, naming the variable, never the key.
        """
        key = self._key_in_environment()
        if key is not None and not HEADER_SAFE_KEY.fullmatch(key):
            raise InvalidApiKeyConfig(
                f"the environment variable {self.api_key_env} holds a key an HTTP header "
                "cannot carry (a line break, a control or non-ASCII character, or spaces "
                "around it); the key was not sent"
            )
        return key

    def key_missing(self) -> str | None:
        """Why the profile cannot be called for want of its key; None when it has one or
        needs none (readiness)."""
        if self.api_key_env and self.api_key() is None:
            return f"the environment variable {self.api_key_env} is not set"
        return None

    def secrets(self) -> tuple[str, ...]:
        """What must never appear in an answer, an error message, a record or a log (the
        key, as the environment holds it, usable or not)."""
        key = self._key_in_environment()
        return (key,) if key else ()


# the keys only a ``local`` profile may set
_LOCAL_KEYS = (
    "external_url",
    "model_path",
    "server",
    "servers",
    "replicas",
    "replica_extra_args",
    "routing",
    "remote_media",
)


class UpstreamLimitsSettings(_Strict):
    """``inference.upstream_limits``: the most an upstream's answer may hold, and how long
    its response head may take once it has begun (docs/security.md#hostile-or-broken-upstreams)."""

    # an answer read whole (a non-streamed answer, an error body), as received
    max_body_mib: float = Field(default=64.0, gt=0)
    # the same answer once its Content-Encoding is undone: a compressed answer may hold
    # what an uncompressed one may, and a bomb stops inflating here
    max_inflated_mib: float = Field(default=64.0, gt=0)
    # one event of a stream (its data lines, or a line that never ends)
    max_event_mib: float = Field(default=8.0, gt=0)
    # the whole of one streamed answer, as inflated: an answer that never ends stops here
    # (a 256k-token answer of llama-server's chunks is about 80 MiB)
    max_stream_mib: float = Field(default=256.0, gt=0)
    # what the gateway keeps of one streamed answer while it streams (reasoning, content
    # kept for a continuation or a check, held tool calls, their ids), each piece counted
    # with 64 bytes of bookkeeping (a 128k-token answer keeps about 9 MiB)
    max_captured_mib: float = Field(default=32.0, gt=0)
    # the status line and headers, 1xx interim responses included
    max_header_kib: float = Field(default=64.0, gt=0)
    # from the first byte of the response head to its end (the wait for that first
    # byte is ``read_timeout_s``: llama-server sends its head only with the first token,
    # or with the whole answer when it is not streamed)
    header_timeout_s: float = Field(default=10.0, gt=0)


class InferenceSettings(_Strict):
    reasoning_history: ReasoningHistory = "auto"
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=600.0, gt=0)
    # the longest a call may run, retries and the whole stream included: an hour, which an
    # agent's turn on slow local hardware stays under (a 32k-token prompt read at 20
    # tokens/s and 8k tokens written at 5/s take under 55 min) and a call that never ends
    # does not (null: no limit)
    max_call_s: float | None = Field(default=3600.0, gt=0)
    # the longest a caller may leave a stream unread before the call is ended
    write_stall_s: float = Field(default=60.0, gt=0)
    upstream_limits: UpstreamLimitsSettings = UpstreamLimitsSettings()


class ObservabilitySettings(_Strict):
    """``observability:``: calls exported as OpenTelemetry traces and metrics over OTLP
    (docs/observability.md). What is left unset here is read from the standard ``OTEL_*``
    environment variables, as the OpenTelemetry SDK documents them."""

    # null: on when an OTLP endpoint is set here or in OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT
    enabled: bool | None = None
    # the collector's base URL (OTLP/HTTP: /v1/traces and /v1/metrics are joined to it)
    endpoint: str | None = None
    protocol: Literal["http/protobuf", "grpc"] | None = None
    # header name: the environment variable holding its value (a token is never written here)
    headers_env: dict[str, str] = {}
    service_name: str | None = None
    # the share of traces begun here that are kept; a caller's sampled flag decides for its own
    sampling: float | None = Field(default=None, ge=0.0, le=1.0)
    # the messages and the answer on the call's span (off: they may hold anything)
    capture_content: bool = False
    # each of the two is cut to this many characters
    content_max_chars: int = Field(default=16384, ge=0)
    # a traceparent on every request to an upstream
    propagate: bool = True
    metrics: bool = True
    # seconds between two exports of the metrics (null: OTEL_METRIC_EXPORT_INTERVAL, else 60)
    metrics_interval_s: float | None = Field(default=None, gt=0)
    # calls waiting to be exported at most; past it a call's spans are dropped, and counted
    queue_calls: int = Field(default=2048, ge=1)
    export_timeout_s: float = Field(default=10.0, gt=0)

    @field_validator("headers_env")
    @classmethod
    def _check_header_env(cls, value: dict[str, str]) -> dict[str, str]:
        for header, env in value.items():
            if not ENV_NAME.fullmatch(env):
                raise ValueError(
                    f"headers_env.{header}: '{env}' is not the name of an environment variable"
                )
        return value


class GatewayConfig(_Strict):
    """The whole configuration file."""

    data_dir: str = ".gateway"
    # one PostgreSQL database for all that several gateways share: the ledger, the task
    # state and the budgets' reservations, unless `ledger:` or `state:` name another
    database: str | None = None
    ledger: str | None = None
    # the task state (reasoning store, history behind `changed`) in a PostgreSQL database
    # several gateways share; unset: `database:`, else files under data_dir and memory
    state: str | None = None
    llama_server_bin: str | None = None
    max_body_mib: float = Field(default=32.0, gt=0)
    metering: MeteringSettings = MeteringSettings()
    inference: InferenceSettings = InferenceSettings()
    auth: AuthSettings | None = None
    budgets: BudgetsSettings = BudgetsSettings()
    rate_limits: RateLimitsSettings = RateLimitsSettings()
    limits: LimitsSettings = LimitsSettings()
    retention: RetentionSettings = RetentionSettings()
    reasoning: ReasoningSettings = ReasoningSettings()
    prompt_cache: PromptCacheSettings = PromptCacheSettings()
    observability: ObservabilitySettings = ObservabilitySettings()
    # the page of calls at /ui/ (on loopback, or for an admin key with auth:)
    ui: bool = True
    models: dict[str, ModelProfile] = Field(min_length=1)

    @field_validator("auth", mode="before")
    @classmethod
    def _auth_not_empty(cls, value: Any) -> Any:
        # a bare "auth:" reads as null, which would leave the gateway open
        if value is None:
            raise ValueError(
                "'auth' is empty; give it 'keys', a 'token_secret_env' or a 'token_secret_file'"
            )
        return value

    @model_validator(mode="after")
    def _check_rate_limit_profiles(self) -> GatewayConfig:
        for name in self.rate_limits.profiles:
            if name not in self.models:
                raise ValueError(
                    f"rate_limits.profiles.{name}: no model profile of that name "
                    f"(the profiles are {', '.join(sorted(self.models))})"
                )
        return self

    @model_validator(mode="after")
    def _check_key_isolation(self) -> GatewayConfig:
        if self.auth is None:
            for name, profile in self.models.items():
                if profile.cache_isolation == "key":
                    raise ValueError(
                        f"models.{name}.cache_isolation: 'key' tells callers apart by their "
                        "keys, and without 'auth' every caller is the same one; configure "
                        "'auth', or use 'task'"
                    )
        return self

    @model_validator(mode="before")
    @classmethod
    def _metering_switch(cls, data: Any) -> Any:
        # `metering: false`, the older form, is the switch alone
        if isinstance(data, dict) and isinstance(data.get("metering"), bool):
            data = {**data, "metering": {"enabled": data["metering"]}}
        return data

    @field_validator("ledger")
    @classmethod
    def _check_ledger(cls, value: str | None) -> str | None:
        if value is not None:
            parse_ledger_url(value)
        return value

    @field_validator("state", "database")
    @classmethod
    def _check_postgres(cls, value: str | None) -> str | None:
        if value is not None:
            parse_postgres_url(value)
        return value

    @property
    def database_location(self) -> PostgresLocation | None:
        """The PostgreSQL database ``database:`` names; None: none."""
        return None if self.database is None else parse_postgres_url(self.database)

    @property
    def state_location(self) -> PostgresLocation | None:
        """The PostgreSQL database of the task state; None: files and memory."""
        if self.state is not None:
            return parse_postgres_url(self.state)
        return self.database_location

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @property
    def ledger_location(self) -> LedgerLocation:
        """Where the ledger lives: an SQLite file (default ``<data_dir>/ledger.db``) or a
        PostgreSQL database."""
        if self.ledger is not None:
            return parse_ledger_url(self.ledger)
        return self.database_location or self.data_path / "ledger.db"

    @property
    def ledger_path(self) -> Path:
        """The SQLite file of the ledger; an error for a PostgreSQL ledger."""
        location = self.ledger_location
        if not isinstance(location, Path):
            raise ValueError(f"the ledger {location} is not an SQLite file")
        return location

    @property
    def calls_path(self) -> Path:
        return calls_path_in(self.data_path)

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mib * 1024 * 1024)

    def reasoning_history_for(self, profile: ModelProfile) -> ReasoningHistory:
        return profile.reasoning_history or self.inference.reasoning_history


def calls_path_in(data_dir: str | Path) -> Path:
    """The call log inside a data directory (``<data_dir>/calls.jsonl``)."""
    return Path(data_dir) / CALLS_FILE


def _is_local(info: ValidationInfo) -> bool:
    """Whether the profile being checked names a local provider (so far as it is known)."""
    provider = info.data.get("provider")
    return isinstance(provider, str) and KINDS[provider].local


def _is_ip_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _quoted(names: list[str], conjunction: str = "and") -> str:
    """'a', 'b' and 'c' (or another conjunction)."""
    quoted = [repr(n) for n in names]
    joined = [", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted
    return f" {conjunction} ".join(joined)


def _line_index(text: str) -> dict[tuple[str, ...], int]:
    """Map each key path in the YAML text to its 1-based line number."""
    index: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = (*path, str(key_node.value))
                index[key] = key_node.start_mark.line + 1
                walk(value_node, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                index[(*path, str(i))] = item.start_mark.line + 1
                walk(item, (*path, str(i)))

    root = yaml.compose(text)
    if root is not None:
        walk(root, ())
    return index


_MESSAGES = {
    "extra_forbidden": "unknown key",
    "missing": "missing required key",
}


# a check of the whole file that is about one key names it first ("models.x.key: ...")
_NAMED_KEY = re.compile(r"([A-Za-z_][\w-]*(?:\.[\w-]+)+): ")


def _describe(err: Any, lines: dict[tuple[str, ...], int], source: str) -> str:
    loc = tuple(str(p) for p in err["loc"])
    msg = _MESSAGES.get(err["type"]) or str(err["msg"]).removeprefix("Value error, ")
    named = _NAMED_KEY.match(msg) if not loc else None
    if named is not None:
        loc = tuple(named.group(1).split("."))
        msg = msg[named.end() :]
    name = ".".join(loc) if loc else "(top level)"
    line = None
    for n in range(len(loc), 0, -1):
        if loc[:n] in lines:
            line = lines[loc[:n]]
            break
    where = f"{source}:{line}" if line else source
    return f"{where}: {name}: {msg}"


def parse_config(text: str, source: str = "<config>") -> GatewayConfig:
    """Parse and validate configuration text; raise ``ConfigError`` naming the key and line."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the configuration must be a mapping of keys")
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc.errors()[0], _line_index(text), source)) from None


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate the configuration file at ``path``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the configuration file: {exc.strerror}") from None
    return parse_config(text, str(p))


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """Where the configuration comes from, read again on each reload: a file, or (no path)
    the configuration embedded in the package."""

    path: Path | None = None

    def load(self) -> GatewayConfig:
        """Read and validate it now; ``ConfigError`` names the key and line."""
        if self.path is not None:
            return load_config(self.path)
        text = resources.files("boundedcode_gateway").joinpath("default_config.yaml").read_text()
        return parse_config(text, EMBEDDED_DEFAULT)
