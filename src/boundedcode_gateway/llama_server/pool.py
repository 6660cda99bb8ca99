"""The llama-servers of one local profile, served: started, probed, and leased to calls.

``pools/`` decides where a call goes from what the gateway knows; this module keeps
that knowledge current and does the I/O. Each server is probed in the background
(``/health``, then ``/slots`` for its busy slots): a dead or loading server takes no
new call, and one that answers again takes calls again. A managed replica that
restarted starts with an empty cache. A call holds a ``ServerLease`` from its start
to its end: the server it was given, and, once, another one if that server dies
before the answer came (``failover``).

A profile of one server is a pool of one: it is never probed in the background (its
readiness has its own probe) and never left.

Under ``cache_isolation`` each server has a ``SlotTable``: the lease also holds a slot
of its call's group on the server it was given, the request is pinned to it
(``id_slot``), and a slot that passes to another group is erased before the call is
sent (docs/security.md, "Shared prompt caches").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from boundedcode_gateway.config import Routing
from boundedcode_gateway.errors import ConfigError, GatewayError, UpstreamUnavailable
from boundedcode_gateway.llama_server.api import LlamaServerAPI, MalformedAnswer, ServerRefused
from boundedcode_gateway.llama_server.launcher import ManagedLlamaServer
from boundedcode_gateway.llama_server.slot_files import RestoreOutcome, SlotFiles
from boundedcode_gateway.llama_server.slots import SlotGrant, SlotKey, SlotTable
from boundedcode_gateway.policy.cache_misses import MISS_TOLERANCE_TOKENS
from boundedcode_gateway.pools.holdings import ConversationKey
from boundedcode_gateway.pools.routing import NoHealthyServer, Pool, RouteReason
from boundedcode_gateway.pools.server_state import ServerState
from boundedcode_gateway.upstream.http import HttpClient
from boundedcode_gateway.upstream.metrics import CallMetrics

log = logging.getLogger(__name__)

# how often each server of a pool is asked whether it is up and how busy it is
PROBE_EVERY_S = 1.0
# a probe that takes longer than this finds the server down
PROBE_TIMEOUT_S = 2.0
# a prompt's length in tokens, guessed from its request's bytes before it is sent
BYTES_PER_TOKEN = 4
# the longest between two looks for slots idle long enough to save
SAVE_CHECK_EVERY_S = 5.0

Headers = Callable[[], dict[str, str]]


@dataclass(slots=True)
class PoolMember:
    """One server of a pool: where it listens, the process when the gateway runs it, and
    what routing knows of it."""

    state: ServerState
    url: str | None = None  # a server the gateway does not run
    managed: ManagedLlamaServer | None = None
    # its ``server.cache_repair``, and (a managed one) the flags added to its command line
    cache_repair: bool = True
    extra_args: tuple[str, ...] = ()
    # the managed server's restarts when it was last probed: a new one empties its cache
    restarts_seen: int = 0
    # what each slot holds, where calls are pinned to slots (None: any call, any slot)
    slots: SlotTable | None = None
    # the server's ``--slot-save-path`` (None: its slots are not saved)
    slot_dir: Path | None = None
    # what a slot file it saves must match besides its ``/props`` (model file, KV flags)
    identity_facts: tuple[str, ...] = ()

    @property
    def generation(self) -> int:
        """Which start of the server this is (a server the gateway does not run: 0)."""
        return self.managed.restarts if self.managed is not None else 0

    def running(self) -> bool:
        return self.managed.ready if self.managed is not None else self.state.healthy

    def root(self) -> str:
        """Where it listens now (a managed server moves to a new port when it restarts)."""
        if self.managed is not None:
            return self.managed.base_url()
        assert self.url is not None
        return self.url


class ServerPool:
    """A profile's servers, their probing, and the lease of one to each call."""

    def __init__(
        self,
        name: str,
        members: Sequence[PoolMember],
        policy: Routing,
        http: HttpClient,
        headers: Headers,
        slot_files: Callable[[LlamaServerAPI], SlotFiles] | None = None,
    ) -> None:
        self.name = name
        self.members = tuple(members)
        self.routing = Pool([m.state for m in self.members], policy)
        self.http = http
        self._headers = headers
        # every request to a server of the pool, with that server's credentials
        self.api = LlamaServerAPI(http, self.headers_for)
        # each conversation's slot saved and restored (None: slot files are off)
        self.slot_files = slot_files(self.api) if slot_files is not None else None
        self._prober: asyncio.Task[None] | None = None
        self._saver: asyncio.Task[None] | None = None
        # told when a managed server is ready again after it exited (the fleet's)
        self.restarted: Callable[[PoolMember], None] | None = None
        for member in self.members:
            if member.managed is not None:
                member.managed.on_restart = functools.partial(self._restarted, member)

    @property
    def several(self) -> bool:
        return len(self.members) > 1

    @property
    def policy(self) -> Routing:
        return self.routing.policy

    async def start(self) -> None:
        """Start the managed servers (together), probe every server once, check that the
        servers that answer run the same model alike, then keep probing."""
        managed = [m.managed for m in self.members if m.managed is not None]
        await asyncio.gather(*(m.start() for m in managed))
        if self.slot_files is not None:
            await self.slot_files.store.load()
            await asyncio.gather(*(self._count_slots(m) for m in self.members))
            self._saver = asyncio.get_running_loop().create_task(self._save_idle_forever())
        if not self.several:
            return
        await asyncio.gather(*(self.probe(m) for m in self.members))
        await self._check_agreement()
        self._prober = asyncio.get_running_loop().create_task(self._probe_forever())

    async def close(self) -> None:
        """Stop probing; save what the slots hold that their files do not; stop the
        servers the gateway runs."""
        for task in (self._prober, self._saver):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._prober = self._saver = None
        if self.slot_files is not None:
            try:
                saved = await self.slot_files.save_all(self.members)
            except Exception:
                log.exception("model %s: saving the slots before the stop failed", self.name)
            else:
                if saved:
                    log.info("model %s: %d slot(s) saved before the stop", self.name, saved)
        await asyncio.gather(*(m.managed.stop() for m in self.members if m.managed is not None))

    def lease(self, key: ConversationKey, group: str | None = None, head: str = "") -> ServerLease:
        """The lease a call of conversation ``key`` holds (its server chosen on first use);
        ``group``: whose prompt cache it may use, under ``cache_isolation``; ``head``: a
        digest of its first message, which with ``key`` names its slot's conversation."""
        return ServerLease(self, key, group, head)

    # -- slots

    def _restarted(self, member: PoolMember) -> None:
        """A managed server is ready again (told before any call can reach it): its slots
        hold nothing."""
        if member.slots is not None:
            member.slots.emptied(member.generation)
        if self.restarted is not None:
            self.restarted(member)

    async def _count_slots(self, member: PoolMember) -> None:
        """A server the gateway does not run whose slots are saved: its slot count, from
        ``GET /props``, for the table its calls are pinned by (none while unknown)."""
        if member.slots is not None or member.slot_dir is None:
            return
        try:
            props = await self.api.props(member.root())
        except (GatewayError, ServerRefused, MalformedAnswer) as exc:
            log.warning(
                "model %s: %s: its slots are not saved, its /props cannot be read: %s",
                self.name,
                member.state.name,
                exc,
            )
            return
        count = props.get("total_slots")
        if isinstance(count, int) and count > 0:
            member.slots = SlotTable(count, isolated=False)

    async def _save_idle_forever(self) -> None:
        files = self.slot_files
        assert files is not None
        every = min(max(files.idle_save_s / 4, 0.05), SAVE_CHECK_EVERY_S)
        while True:
            await asyncio.sleep(every)
            try:
                await files.save_idle(self.members)
            except Exception:
                log.exception("model %s: saving idle slots failed", self.name)

    async def ready_slot(
        self, member: PoolMember, grant: SlotGrant, conversation: SlotKey, group: str | None
    ) -> RestoreOutcome | None:
        """Make slot ``grant.index`` of ``member`` ready for a call of ``conversation``: the
        conversation leaving it saved; the call's own saved where another server holds
        more of it than its file, then restored (also over an older state of it in the
        slot), else the slot erased where isolation needs it; what was saved and
        restored, if anything."""
        files = self.slot_files
        outcome: RestoreOutcome | None = None
        save_ms: float | None = None
        if files is not None and grant.leaving is not None:
            save_ms = await files.save(member, grant.index, grant.leaving)
        if files is not None and self.several:
            # the conversation may have left another server since its file was saved
            moved_ms = await files.save_left(self.members, member, conversation, group)
            if moved_ms is not None:
                save_ms = (save_ms or 0.0) + moved_ms
        if files is not None and (
            not grant.resident or files.newer(conversation, group, grant.tokens)
        ):
            outcome = await files.restore(member, grant.index, conversation, group)
        if outcome is not None and outcome.tokens and member.slots is not None:
            member.slots.restored(grant.index, outcome.expected)
        elif grant.erase:
            await self.erase_slot(member, grant.index)
        if save_ms is not None:
            outcome = outcome or RestoreOutcome()
            outcome.save_ms = save_ms
        return outcome

    async def erase_slot(self, member: PoolMember, index: int) -> None:
        """Empty slot ``index`` of ``member``'s server (its tokens and checkpoints); the
        server answers once the call that used it has ended."""
        try:
            await self.api.erase_slot(member.root(), index)
        except ServerRefused as exc:
            # the server's own words go to the log, not to the caller
            log.warning(
                "model %s: %s did not erase slot %d: HTTP %d %s",
                self.name,
                member.state.name,
                index,
                exc.status,
                exc.body[:200].decode(errors="replace"),
            )
            raise UpstreamUnavailable(
                f"model '{self.name}': the server did not empty slot {index}, which held "
                f"another caller's prompt (HTTP {exc.status}); the call was not sent"
            ) from None

    def headers_for(self, url: str) -> dict[str, str]:
        """What a request to ``url`` (or a server's root) carries to be let in: the key of
        the managed server listening there, else the profile's own (``api_key_env``, for a
        server the gateway does not run)."""
        for member in self.members:
            if member.managed is not None and member.managed.serves(url):
                return member.managed.auth_headers()
        return self._headers()

    def healthy_root(self) -> str:
        """The first server that is up, for what any of them can answer (``/props``)."""
        for member in self.members:
            if member.state.healthy:
                with contextlib.suppress(UpstreamUnavailable):
                    return member.root()
        return self.members[0].root()

    # -- probing

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(PROBE_EVERY_S)
            await asyncio.gather(*(self.probe(m) for m in self.members))

    async def probe(self, member: PoolMember) -> bool:
        """Ask the server whether it is up (and how busy); note what it said; whether up."""
        state = member.state
        managed = member.managed
        if managed is not None and managed.restarts != member.restarts_seen:
            member.restarts_seen = managed.restarts
            state.restarted()
            log.info("model %s: %s started again; its cache is empty", self.name, state.name)
        try:
            root = member.root()
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                await self.api.health(root)
                up = True
                slots = await self._slots(root)
        except (GatewayError, ServerRefused, TimeoutError):
            up, slots = False, None
        if up != state.healthy:
            log.warning("model %s: %s is %s", self.name, state.name, "up" if up else "down")
            if up:
                # what a server held before it went down is not to be counted on: it may
                # have been started again
                state.restarted()
        state.healthy = up
        if isinstance(slots, list):
            busy = sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing") is True)
            state.slots_read(busy, len(slots) or None)
        else:
            state.slots_read(None)
        return up

    async def _slots(self, root: str) -> Any:
        """The server's ``/slots`` (None where it has none to show)."""
        try:
            return await self.api.slots(root)
        except (ServerRefused, MalformedAnswer):
            return None

    async def _check_agreement(self) -> None:
        """Servers that disagree on their chat template or context size are not copies of
        one model: a conversation moved between them would not be served alike."""
        seen: list[tuple[str, tuple[Any, Any]]] = []
        for member in self.members:
            if not member.state.healthy:
                continue
            try:
                props = await self.api.props(member.root())
            except (GatewayError, ServerRefused, MalformedAnswer):
                continue
            if "chat_template_caps" not in props:
                continue  # not llama.cpp: nothing to compare
            settings = props.get("default_generation_settings") or {}
            seen.append((member.state.name, (props.get("chat_template"), settings.get("n_ctx"))))
        differing = sorted({name for name, shown in seen if shown != seen[0][1]})
        if differing:
            raise ConfigError(
                f"models.{self.name}: the servers of a pool must run the same model alike, but "
                f"{', '.join(differing)} differ(s) from {seen[0][0]} in chat template or "
                "context size (GET /props)"
            )

    # -- what the servers show an operator

    def describe(self, index: int) -> dict[str, Any]:
        """What routing knows of one server, for ``/v1/models/{name}`` and the page of calls."""
        state = self.members[index].state
        return {
            "name": state.name,
            "healthy": state.healthy,
            "in_flight": state.in_flight,
            "busy_slots": state.busy_slots,
            "parallel": state.parallel,
            "conversations": len(state.holdings),
            "held_tokens": state.holdings.total_tokens,
            "prefill_tps": _rounded(state.prefill_tps),
        }


class ServerLease:
    """The server one call is sent to, from its first request to its end: chosen when the
    call's first request is made, left once for another server if it dies before the
    answer came."""

    __slots__ = (
        "_conversation",
        "_group",
        "_index",
        "_key",
        "_moved",
        "_pool",
        "_released",
        "_slot",
        "reason",
        "restore",
    )

    def __init__(
        self, pool: ServerPool, key: ConversationKey, group: str | None = None, head: str = ""
    ) -> None:
        self._pool = pool
        self._key = key
        self._group = group
        self._conversation: SlotKey = (*key, head)
        self._index: int | None = None
        # (server, slot) held where calls are pinned to slots
        self._slot: tuple[int, int] | None = None
        self._moved = False
        self._released = False
        # why the call went where it did (None until chosen)
        self.reason: RouteReason | None = None
        # what was saved and restored for the call's slot, and whether it worked
        self.restore: RestoreOutcome | None = None

    @property
    def group(self) -> str | None:
        """Whose prompt cache the call may use (None: anyone's, no isolation)."""
        return self._group

    @property
    def slot(self) -> SlotHold | None:
        """The slot the call ran in, where calls are pinned (for the cache keeper's repair)."""
        if self._slot is None:
            return None
        table = self._pool.members[self._slot[0]].slots
        assert table is not None
        return SlotHold(table, self._slot[1], self._group, self._conversation)

    async def pinned(self, body: bytes) -> bytes:
        """``body`` (an object, as the adapter wrote it) pinned to a slot of its server
        that is ready for the call's conversation (waiting while all are in use): the
        conversation leaving it saved, the call's own restored from its file, or, under
        isolation, the slot erased if it held another group's prompts. Unchanged where
        the server's calls are not pinned."""
        index = self._index
        if index is None:
            return body
        pool = self._pool
        member = pool.members[index]
        table = member.slots
        if table is None:
            return body
        if self._slot is None or self._slot[0] != index:
            self._release_slot()
            grant = await table.acquire(self._group, self._conversation)
            try:
                outcome = await pool.ready_slot(member, grant, self._conversation, self._group)
            except BaseException:
                table.release(grant.index, erased=False)
                raise
            if outcome is not None:
                # a failover's restore is the one the answer is judged by
                if self.restore is not None and outcome.save_ms is None:
                    outcome.save_ms = self.restore.save_ms
                self.restore = outcome
            self._slot = (index, grant.index)
        return pin_body(body, self._slot[1])

    def _release_slot(self) -> None:
        if self._slot is not None:
            member, slot = self._slot
            table = self._pool.members[member].slots
            assert table is not None
            table.release(slot)
            self._slot = None

    @property
    def state(self) -> ServerState | None:
        """The state of the server the call is on (None until chosen)."""
        return None if self._index is None else self._pool.members[self._index].state

    @property
    def server(self) -> str | None:
        """The name of the server the call is on (None until chosen)."""
        return None if self._index is None else self._pool.members[self._index].state.name

    @property
    def moved(self) -> Literal["rebalanced", "failover"] | None:
        """Why the call left the server expected to hold its conversation (None: it did not)."""
        if self.reason == "rebalanced":
            return "rebalanced"
        if self.reason == "failover":
            return "failover"
        return None

    def root(self, request_bytes: int) -> str:
        """The chosen server's root URL; chosen on the first call, from the request's size.
        No server up is a 503."""
        pool = self._pool
        if self._index is None and not pool.several:
            self._take(0, "stayed")
        while self._index is None:
            try:
                choice = pool.routing.choose(self._key, request_bytes // BYTES_PER_TOKEN)
            except NoHealthyServer as exc:
                raise UpstreamUnavailable(
                    f"model '{pool.name}': {exc}; try again shortly"
                ) from None
            member = pool.members[choice.index]
            try:
                root = member.root()
            except UpstreamUnavailable:
                # a managed server that died since its last probe: not up, choose again
                member.state.healthy = False
                continue
            self._take(choice.index, choice.reason)
            return root
        return pool.members[self._index].root()

    def current_root(self) -> str | None:
        """Where the call's server listens now (None: not chosen, or not running)."""
        if self._index is None:
            return None
        try:
            return self._pool.members[self._index].root()
        except UpstreamUnavailable:
            return None

    def _take(self, index: int, reason: RouteReason) -> None:
        if self._index is not None:
            self._pool.members[self._index].state.call_ended()
            if self._slot is not None and self._slot[0] != index:
                self._release_slot()
        self._index = index
        self.reason = reason
        self._pool.members[index].state.call_started()

    def headers_for(self, url: str) -> dict[str, str]:
        """The credentials of the server ``url`` is on (after a failover, the new one's)."""
        return self._pool.headers_for(url)

    async def moved_root(self) -> str | None:
        """After a failed send or an answer that broke off: if the server is down, the root
        of another server that is up, which the call now holds (once per call); None to
        stay."""
        pool, index = self._pool, self._index
        if self._moved or index is None or not pool.several:
            return None
        member = pool.members[index]
        try:
            member.root()
            running = True
        except UpstreamUnavailable:
            running = False
        if running and await pool.probe(member):
            return None  # it is up: the failure was the answer's, not the server's
        try:
            choice = pool.routing.choose(self._key, 0)
        except NoHealthyServer:
            return None
        self._moved = True
        self._take(choice.index, "failover")
        return pool.members[choice.index].root()

    def answered(self, metrics: CallMetrics, diverged: bool = False) -> None:
        """The answer's timings: what the server now holds of the conversation, its speed;
        whether a restore before it worked (``diverged``: the conversation's earlier
        messages changed since its file was saved, so less of it could be found)."""
        if self._index is None or metrics.prompt_tokens is None:
            return
        cached = metrics.cached_tokens or 0
        member = self._pool.members[self._index]
        if self._slot is not None and member.slots is not None:
            member.slots.filled(self._slot[1], metrics.prompt_tokens)
        outcome = self.restore
        if outcome is not None and metrics.cached_tokens is not None:
            outcome.judge(metrics.prompt_tokens, cached, diverged, MISS_TOLERANCE_TOKENS)
            files = self._pool.slot_files
            if files is not None and outcome.verdict not in (None, "effective"):
                files.ineffective(member, outcome)
        evaluated = metrics.evaluated_tokens
        if evaluated is None:
            evaluated = metrics.prompt_tokens - cached
        slot_ms = None
        if metrics.prefill_ms is not None and metrics.decode_ms is not None:
            slot_ms = metrics.prefill_ms + metrics.decode_ms
        self._pool.members[self._index].state.answered(
            self._key,
            cached,
            evaluated,
            metrics.completion_tokens or 0,
            metrics.prefill_ms,
            slot_ms,
        )

    def release(self) -> None:
        """The call ended: its slot on the server is free."""
        self._release_slot()
        if self._index is not None and not self._released:
            self._released = True
            self._pool.members[self._index].state.call_ended()


@dataclass(frozen=True, slots=True)
class SlotHold:
    """Slot ``index`` of a server, as its conversation's: what the cache keeper repairs in."""

    table: SlotTable
    index: int
    group: str | None
    conversation: SlotKey

    def take(self) -> bool:
        """Hold the slot, if it is free and still holds the conversation (of the group)."""
        return self.table.take_own(self.index, self.group, self.conversation)

    def release(self, tokens: int | None = None) -> None:
        """Free it; ``tokens``: what the repair left there for the next call."""
        if tokens is not None:
            self.table.filled(self.index, tokens)
        self.table.release(self.index)


def _slot_prefix(index: int) -> bytes:
    return b'{"id_slot":%d,' % index


def pin_body(body: bytes, index: int) -> bytes:
    """``body`` with ``id_slot`` first. The adapter wrote it without one (a caller's is
    taken out under isolation); a body pinned before (a continuation of it, or a failover
    to another server) has its own first, and it is replaced."""
    prefix = _slot_prefix(index)
    if body.startswith(prefix):
        return body
    if body.startswith(b'{"id_slot":'):
        end = body.index(b",", len(b'{"id_slot":'))
        return prefix + body[end + 1 :]
    if not body.startswith(b"{") or body[1:2] == b"}":
        raise ValueError("a request to pin to a slot is a JSON object with fields")
    return prefix + body[1:]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
