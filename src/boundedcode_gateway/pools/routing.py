"""Which server of a pool a call goes to, and why.

``affinity`` (the default) sends a call to the server expected to hold most of its
conversation, so that only the new part of the prompt is evaluated. It leaves that
server only when every slot there is taken and another server is expected to have
the prompt evaluated sooner: the tokens it lacks at its measured speed, plus its
own wait for a slot. A conversation no server is known to hold goes to the least
busy server. ``least_busy`` and ``round_robin`` ignore the caches; they are there
to compare with.

The reason says whether the conversation left the server expected to hold most
of it: ``stayed`` there, ``rebalanced`` away from it while it was up (affinity: it
was busy and another was faster), ``failover`` because it is down; ``new`` when no
server held it. Unhealthy servers are never chosen; with none up, ``NoHealthyServer``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from boundedcode_gateway.config import Routing
from boundedcode_gateway.pools.holdings import ConversationKey
from boundedcode_gateway.pools.server_state import (
    DEFAULT_PREFILL_TPS,
    DEFAULT_SLOT_S,
    ServerState,
)

RouteReason = Literal["new", "stayed", "rebalanced", "failover"]


class NoHealthyServer(Exception):
    """No server of the pool is up: the call cannot be sent (the caller answers 503)."""

    def __init__(self, servers: int) -> None:
        super().__init__(f"none of the {servers} server(s) of the pool is up")
        self.servers = servers


@dataclass(frozen=True, slots=True)
class Choice:
    """The server a call goes to, and why."""

    index: int  # in the pool's order
    server: ServerState
    reason: RouteReason
    # the server expected to hold most of the conversation (None: none holds any)
    held_by: int | None
    # the prompt's tokens expected from the chosen server's cache
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Speeds:
    """What a server that has measured nothing yet is taken to do: the pool's mean of
    those that have, else the defaults."""

    prefill_tps: float
    slot_s: float

    @classmethod
    def of_pool(cls, servers: Sequence[ServerState]) -> Speeds:
        tps = [s.prefill_tps for s in servers if s.prefill_tps is not None]
        slot = [s.slot_s for s in servers if s.slot_s is not None]
        return cls(
            sum(tps) / len(tps) if tps else DEFAULT_PREFILL_TPS,
            sum(slot) / len(slot) if slot else DEFAULT_SLOT_S,
        )


def expected_cached(server: ServerState, key: ConversationKey, prompt_tokens: int) -> int:
    """The prompt's tokens the server is expected to serve from its cache."""
    return min(server.holdings.expected(key), max(prompt_tokens, 0))


def expected_seconds(
    server: ServerState, cached_tokens: int, prompt_tokens: int, speeds: Speeds
) -> float:
    """Until the server has evaluated the prompt: its wait for a slot, then the tokens
    it lacks at its speed. With every slot taken, a call waits for the calls queued
    before it and its own turn, the slots freeing one by one every ``slot_s / parallel``
    on average."""
    tps = server.prefill_tps or speeds.prefill_tps
    slot_s = server.slot_s or speeds.slot_s
    queued = server.load - server.parallel + 1
    wait_s = queued * slot_s / server.parallel if queued > 0 else 0.0
    return max(prompt_tokens - cached_tokens, 0) / tps + wait_s


def choose(
    key: ConversationKey,
    prompt_tokens: int,
    servers: Sequence[ServerState],
    policy: Routing = "affinity",
    *,
    turn: int = 0,
) -> Choice:
    """The server of ``servers`` a call of conversation ``key`` goes to, its prompt
    about ``prompt_tokens`` long; ``turn`` is where ``round_robin`` starts looking."""
    healthy = [i for i, s in enumerate(servers) if s.healthy]
    if not healthy:
        raise NoHealthyServer(len(servers))
    held = [s.holdings.expected(key) for s in servers]
    holder = _holder(servers, held, range(len(servers)))
    if policy == "affinity":
        index = _by_affinity(key, prompt_tokens, servers, held, healthy)
    elif policy == "least_busy":
        index = _least_busy(servers, healthy)
    else:
        index = next(i for i in _from(turn, len(servers)) if servers[i].healthy)
    if holder is None:
        reason: RouteReason = "new"
    elif not servers[holder].healthy:
        reason = "failover"
    else:
        reason = "stayed" if index == holder else "rebalanced"
    cached = expected_cached(servers[index], key, prompt_tokens)
    return Choice(index, servers[index], reason, holder, cached)


def _by_affinity(
    key: ConversationKey,
    prompt_tokens: int,
    servers: Sequence[ServerState],
    held: list[int],
    healthy: list[int],
) -> int:
    best = _holder(servers, held, healthy)
    if best is None:
        return _least_busy(servers, healthy)
    if not servers[best].busy:
        return best
    speeds = Speeds.of_pool(servers)

    def cost(i: int) -> tuple[float, int, float, int, int]:
        cached = expected_cached(servers[i], key, prompt_tokens)
        seconds = expected_seconds(servers[i], cached, prompt_tokens, speeds)
        # equally fast: the one holding more, then the less busy
        return (seconds, -held[i], *_busyness(servers[i]), i)

    fastest = min(healthy, key=cost)
    # only a server expected to be faster takes the conversation away
    return fastest if cost(fastest)[0] < cost(best)[0] else best


def _holder(servers: Sequence[ServerState], held: list[int], among: Sequence[int]) -> int | None:
    """The server of ``among`` expected to hold most of the conversation (None: none
    holds any); of equals, one that is up, then the least busy, then the first."""
    holding = [i for i in among if held[i] > 0]
    if not holding:
        return None
    return min(holding, key=lambda i: (-held[i], not servers[i].healthy, *_busyness(servers[i]), i))


def _least_busy(servers: Sequence[ServerState], among: list[int]) -> int:
    """The server with the smallest share of its slots taken; of equals, the one with
    fewer calls, then the one expected to hold less (new conversations spread over the
    caches), then the first."""
    return min(among, key=lambda i: (*_busyness(servers[i]), servers[i].holdings.total_tokens, i))


def _busyness(server: ServerState) -> tuple[float, int]:
    return (server.load / server.parallel, server.load)


def _from(turn: int, n: int) -> list[int]:
    """The positions from ``turn`` round to the one before it."""
    start = turn % n
    return [*range(start, n), *range(start)]


class Pool:
    """A profile's servers and how calls are routed over them; ``round_robin``'s turn."""

    __slots__ = ("_turn", "policy", "servers")

    def __init__(self, servers: Sequence[ServerState], policy: Routing = "affinity") -> None:
        if not servers:
            raise ValueError("a pool has one server or more")
        self.servers = tuple(servers)
        self.policy: Routing = policy
        self._turn = 0

    def choose(self, key: ConversationKey, prompt_tokens: int) -> Choice:
        """The server for a call of conversation ``key`` (see ``choose``); round robin
        moves on past the server chosen."""
        choice = choose(key, prompt_tokens, self.servers, self.policy, turn=self._turn)
        if self.policy == "round_robin":
            self._turn = (choice.index + 1) % len(self.servers)
        return choice
