"""Everything the gateway derives from its configuration file, as one value swapped whole.

``LiveConfig`` holds the configuration and what is built from it: one ``Route`` (the
profile's upstream, a local profile's servers, and the calls on it) per model profile.
A reload builds a new ``LiveConfig`` next to the running one, keeping each route whose
profile did not change (a managed llama-server keeps running); the service then serves
new calls from the new one in a single assignment. Anything else derived from the
configuration belongs here too, so that a reload swaps it with the rest.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from boundedcode_gateway.access.authenticate import Authenticator
from boundedcode_gateway.access.sites import DEFAULT_LISTEN_HOST, SitePolicy
from boundedcode_gateway.access.token_secret import TokenSecrets, token_secrets
from boundedcode_gateway.budgets.reservation import Reservation, reservation_for
from boundedcode_gateway.config import GatewayConfig, ModelProfile, PriceSettings
from boundedcode_gateway.llama_server.fleet import LocalFleet, local_fleet
from boundedcode_gateway.llama_server.slot_store import SlotStore
from boundedcode_gateway.providers.base import Upstream
from boundedcode_gateway.providers.openai_compat.adapter import OpenAICompatUpstream
from boundedcode_gateway.providers.registry import build_upstream
from boundedcode_gateway.trace_context import TracePolicy, policy_of
from boundedcode_gateway.upstream.http import HttpClient

# settings read once at start: a reload that changes them names them in a warning
RESTART_ONLY: tuple[tuple[str, ...], ...] = (
    ("data_dir",),
    ("database",),
    ("ledger",),
    ("state",),
    ("metering",),
    ("inference", "connect_timeout_s"),
    ("inference", "read_timeout_s"),
    # the shared HTTP client's limits, and the protocol's write-stall timer
    ("inference", "upstream_limits"),
    ("inference", "write_stall_s"),
    # the connection limits and the body parser are the server's; allowed_hosts reloads
    ("limits", "idle_timeout_s"),
    ("limits", "header_timeout_s"),
    ("limits", "max_header_bytes"),
    ("limits", "max_parsing_mib"),
    ("limits", "max_connections"),
    ("limits", "max_reading_mib"),
    ("retention",),
    ("prompt_cache",),
)


class Route:
    """One model profile's upstream, its servers where it runs on local ones, what they were
    built from, and the calls on it now."""

    __slots__ = ("_idle", "fleet", "in_flight", "inputs", "name", "upstream")

    def __init__(
        self,
        name: str,
        upstream: Upstream,
        inputs: tuple[object, ...],
        fleet: LocalFleet | None = None,
    ) -> None:
        self.name = name
        self.upstream = upstream
        self.inputs = inputs
        # a local profile's servers (None for a cloud API)
        self.fleet = fleet
        self.in_flight = 0
        self._idle: asyncio.Event | None = None

    async def start(self) -> None:
        """Start what the profile runs itself (its managed llama-servers, a pool's probes)."""
        if self.fleet is not None:
            await self.fleet.start()

    async def close(self) -> None:
        """Release what the profile holds (its servers, their cache keeper's follow-ups)."""
        if self.fleet is not None:
            await self.fleet.close()

    def enter(self) -> None:
        """A call on this route began (its record's submission ends it: ``leave``)."""
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()

    async def idle(self) -> None:
        """Return once no call is on this route (new calls no longer reach a retired one)."""
        if self.in_flight == 0:
            return
        if self._idle is None:
            self._idle = asyncio.Event()
        await self._idle.wait()


def profile_inputs(profile: ModelProfile, config: GatewayConfig) -> tuple[object, ...]:
    """What a profile's upstream is built from: equal inputs, the same upstream."""
    managed_binary = config.llama_server_bin if profile.model_path else None
    # a new price must not restart a managed server: calls read it from the config
    unpriced = profile.model_copy(update={"price": None})
    return (unpriced, config.reasoning_history_for(profile), managed_binary)


# what a configuration built without a listening address answers to: loopback only
LOOPBACK_SITES = SitePolicy(DEFAULT_LISTEN_HOST)


@dataclass(frozen=True, slots=True)
class LiveConfig:
    """The configuration the gateway serves new calls from, and what was built from it."""

    config: GatewayConfig
    routes: Mapping[str, Route]
    # the hosts requests may name (the listening address and ``limits.allowed_hosts``)
    sites: SitePolicy = LOOPBACK_SITES
    # who may call, from ``auth:``; None: every request is answered without a caller
    authenticator: Authenticator | None = None
    # how calls join traces (``observability:``); None: no trace is exported
    tracing: TracePolicy | None = None

    @property
    def upstreams(self) -> dict[str, Upstream]:
        return {name: route.upstream for name, route in self.routes.items()}

    @property
    def fleets(self) -> dict[str, LocalFleet]:
        """The servers of each local profile."""
        return {n: r.fleet for n, r in self.routes.items() if r.fleet is not None}

    def price_of(self, model: str) -> PriceSettings | None:
        """The price of a profile's calls (None: unpriced, or no such profile)."""
        profile = self.config.models.get(model)
        return profile.price if profile is not None else None

    def reservation_of(self, model: str, body: dict[str, Any]) -> Reservation:
        """What a call of chat ``body`` on profile ``model`` may spend at most."""
        profile = self.config.models.get(model)
        budgets = self.config.budgets
        return reservation_for(
            body,
            profile.price if profile is not None else None,
            profile_cap=profile.max_tokens if profile is not None else None,
            output_estimate=budgets.reserve_output_tokens,
            call_s_estimate=budgets.reserve_call_s,
        )

    @property
    def max_body_bytes(self) -> int:
        return self.config.max_body_bytes


def build_live_config(
    config: GatewayConfig,
    http: HttpClient,
    previous: LiveConfig | None = None,
    listen_host: str = DEFAULT_LISTEN_HOST,
    environ: Mapping[str, str] = os.environ,
    secrets: TokenSecrets | None = None,
    slot_store: SlotStore | None = None,
) -> LiveConfig:
    """The routes of ``config``: those of ``previous`` whose inputs are unchanged, new
    upstreams (built, not started) for the others; its callers' keys and the hosts it
    answers to. ``secrets``: the token secrets, read off the event loop by a reload; None
    reads them here, from ``environ`` or their file. Raises ``ConfigError`` for a profile
    that cannot be built, or a token secret that cannot be read; upstreams built before it
    hold nothing until started."""
    sites = SitePolicy(listen_host, config.limits.allowed_hosts)
    authenticator = None
    auth = config.auth
    if auth is not None:
        if secrets is None and auth.takes_tokens:
            secrets = token_secrets(auth, environ)
        authenticator = Authenticator(auth, secrets if auth.takes_tokens else None)
    routes: dict[str, Route] = {}
    for name, profile in config.models.items():
        inputs = profile_inputs(profile, config)
        kept = previous.routes.get(name) if previous is not None else None
        if kept is not None and kept.inputs == inputs:
            routes[name] = kept
        else:
            routes[name] = build_route(name, profile, config, http, inputs, slot_store)
    return LiveConfig(
        config, routes, sites, authenticator, policy_of(config.observability, environ)
    )


def build_route(
    name: str,
    profile: ModelProfile,
    config: GatewayConfig,
    http: HttpClient,
    inputs: tuple[object, ...] = (),
    slot_store: SlotStore | None = None,
) -> Route:
    """A profile's route, built, not started: a local profile's servers, and the adapter
    that is handed their traits and makes the request whose prompt they count.
    ``slot_store``: the gateway's slot files (None: slots are not saved)."""
    fleet = local_fleet(name, profile, config, http, slot_store)
    if fleet is None:
        return Route(name, build_upstream(name, profile, config, http), inputs)
    adapter = OpenAICompatUpstream(name, profile, config, http, fleet)
    fleet.counts_with(adapter.token_count_request, adapter.error_from_response)
    return Route(name, adapter, inputs, fleet)


def restart_only_changes(old: GatewayConfig, new: GatewayConfig) -> list[str]:
    """The settings that differ between two configurations but are read only at start."""
    changed: list[str] = []
    old_values, new_values = old.model_dump(), new.model_dump()
    for path in RESTART_ONLY:
        a, b = old_values, new_values
        for key in path:
            a, b = a[key], b[key]
        if a != b:
            changed.append(".".join(path))
    return changed


@dataclass(frozen=True, slots=True)
class RouteChanges:
    """How a new ``LiveConfig`` differs from the running one, by profile name."""

    added: tuple[str, ...]
    changed: tuple[str, ...]
    removed: tuple[str, ...]
    unchanged: tuple[str, ...]

    def describe(self) -> str:
        parts = [
            f"{label} {', '.join(names)}"
            for label, names in (
                ("added", self.added),
                ("changed", self.changed),
                ("removed", self.removed),
                ("unchanged", self.unchanged),
            )
            if names
        ]
        return "; ".join(parts)


def route_changes(old: LiveConfig, new: LiveConfig) -> RouteChanges:
    added = tuple(n for n in new.routes if n not in old.routes)
    removed = tuple(n for n in old.routes if n not in new.routes)
    changed = tuple(n for n, r in new.routes.items() if n in old.routes and old.routes[n] is not r)
    unchanged = tuple(n for n, r in new.routes.items() if old.routes.get(n) is r)
    return RouteChanges(added, changed, removed, unchanged)
