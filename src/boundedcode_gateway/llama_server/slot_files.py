"""Saving and restoring each conversation's slot, for one local profile's servers.

A conversation's slot is saved to its file when the slot is about to serve another
conversation (on the call that takes it: a save takes milliseconds), when it has been
idle for ``prompt_cache.idle_save_s`` (in the background), and before the servers
stop (the gateway's end, a reload that replaces them). Before a call goes to a slot
that does not hold its conversation, the conversation's file is restored there,
whichever server of the pool the call went to: after a server restarted, after a
failover or a rebalance, after another conversation took the slot. A restore is
checked once the call is answered (``RestoreOutcome.verdict``): the answer must find
the restored tokens cached; a call that does not says why in its record
(``miss_cause: restore_ineffective``). A server that restored and evaluated them again
all the same is restored to no more, nor any server of its model, build and KV layout,
for the rest of the gateway's life (that build and model do not keep a restored state:
llama.cpp's sliding-window and hybrid models); such a server, started again, has the
conversations it served last evaluated again in the background instead, while it is
idle (``cache_keeper.py``).

Every server request here goes through the pool's llama-server client; the files are
the store's (``slot_store.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson

from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.errors import GatewayError
from boundedcode_gateway.json_values import count_or_none
from boundedcode_gateway.llama_server.api import LlamaServerAPI, MalformedAnswer, ServerRefused
from boundedcode_gateway.llama_server.slot_store import (
    REFUSALS,
    Saving,
    SlotStore,
    slot_file_name,
)
from boundedcode_gateway.llama_server.slots import Occupant, SlotKey
from boundedcode_gateway.metering.bus import RecordSink
from boundedcode_gateway.metering.meter import Meter
from boundedcode_gateway.metering.records import SLOT_SAVE_PURPOSE

if TYPE_CHECKING:
    from boundedcode_gateway.llama_server.pool import PoolMember

log = logging.getLogger(__name__)

# a conversation shorter than this is evaluated again rather than restored: reading its
# file would cost about as much
MIN_RESTORE_TOKENS = 32
# how long a restore may take at most, as a multiple of what evaluating its tokens again
# is expected to take (and never less than the floor): a restore must not hold a call
# longer than evaluating the prompt would
RESTORE_TIME_FLOOR_S = 2.0
# prompt tokens a second a server evaluates, until it has measured its own
ASSUMED_PREFILL_TPS = 200.0
# a restore whose call found this share of the prompt (and the cache-miss tolerance)
# less cached than restored still counted as working
RESTORE_SLACK_SHARE = 0.02

RestoreVerdict = Literal["effective", "file_refused", "reevaluated", "prefix_diverged"]


@dataclass(slots=True)
class RestoreOutcome:
    """What a call's slot was given before it was sent, and, once answered, whether it
    worked."""

    tokens: int = 0  # restored (0: none)
    expected: int = 0  # of them, what the call is to find cached
    restore_ms: float | None = None
    save_ms: float | None = None  # saving the conversation that left the slot
    # why no file was restored, where one was there to restore
    refused: str | None = None
    verdict: RestoreVerdict | None = None

    @property
    def failure(self) -> str | None:
        """The record's ``restore_failure``: the verdict and its reason, when not effective."""
        if self.verdict is None or self.verdict == "effective":
            return None
        if self.verdict == "file_refused" and self.refused:
            return f"file_refused: {self.refused}"
        return self.verdict

    def judge(self, prompt_tokens: int, cached_tokens: int, diverged: bool, tolerance: int) -> None:
        """Whether the call found what was restored: ``verdict`` set."""
        if self.refused is not None:
            self.verdict = "file_refused"
            return
        if not self.tokens:
            return
        expected = min(self.expected, prompt_tokens)
        slack = tolerance + int(RESTORE_SLACK_SHARE * prompt_tokens)
        if cached_tokens + slack >= expected:
            self.verdict = "effective"
        else:
            self.verdict = "prefix_diverged" if diverged else "reevaluated"


@dataclass(slots=True)
class SlotFileCounts:
    """What the slot files did, for ``/metrics``."""

    saves: int = 0
    save_failures: int = 0
    restores: int = 0
    refused: int = 0
    ineffective: int = 0


class SlotFiles:
    """The save and restore of one profile's conversations, over its servers."""

    def __init__(
        self,
        profile: str,
        store: SlotStore,
        api: LlamaServerAPI,
        idle_save_s: float,
    ) -> None:
        self.profile = profile
        self.store = store
        self._api = api
        self.idle_save_s = idle_save_s
        self.counts = SlotFileCounts()
        # where each save's record goes (the record bus, once the first call made it)
        self.records: RecordSink | None = None
        # per server: the identity of its current start
        self._identities: dict[str, tuple[int, str]] = {}
        # the identities (model file, build, KV layout) whose restores were evaluated
        # again: not restored to for the rest of the gateway's life
        self._not_restoring: dict[str, str] = {}

    def name_of(self, conversation: SlotKey, group: str | None) -> str:
        task, purpose, head = conversation
        return slot_file_name(self.profile, group or "", task, purpose, head)

    # -- a server's identity

    async def identity(self, member: PoolMember) -> str | None:
        """What a slot file saved by ``member``'s current start fits: its model file, its
        build, its context size and KV cache flags, read from ``GET /props`` (None: it
        cannot be read now)."""
        generation = member.generation
        known = self._identities.get(member.state.name)
        if known is not None and known[0] == generation:
            return known[1]
        try:
            props = await self._api.props(member.root())
        except (GatewayError, ServerRefused, MalformedAnswer):
            return None
        settings = props.get("default_generation_settings") or {}
        facts: list[Any] = [
            props.get("model_path"),
            props.get("model_ftype"),
            props.get("build_info"),
            settings.get("n_ctx") if isinstance(settings, dict) else None,
            *member.identity_facts,
        ]
        identity = hashlib.sha256(orjson.dumps(facts)).hexdigest()[:32]
        self._identities[member.state.name] = (generation, identity)
        return identity

    def forget_identity(self, member: PoolMember) -> None:
        """``member``'s identity is read anew before its next save or restore (its model
        or binary may have been swapped; a restart of the same command keeps it, and a
        new start's is read again anyway)."""
        self._identities.pop(member.state.name, None)

    def restoring(self, member: PoolMember) -> bool:
        """Whether ``member``'s slots are restored: it saves slots, and no restore on a
        server of its identity was evaluated again (as far as its identity is known)."""
        if member.slot_dir is None:
            return False
        known = self._identities.get(member.state.name)
        return known is None or known[1] not in self._not_restoring

    def ineffective(self, member: PoolMember, outcome: RestoreOutcome) -> None:
        """A restore on ``member`` bought nothing: counted, and if the server evaluated the
        restored tokens again, no server of its identity is restored to any more."""
        self.counts.ineffective += 1
        known = self._identities.get(member.state.name)
        if outcome.verdict != "reevaluated" or known is None or not self.restoring(member):
            return
        self._not_restoring[known[1]] = outcome.verdict
        log.warning(
            "model %s: %s evaluated a restored slot's %d tokens again; no server of its "
            "model, build and KV layout is restored to until the gateway starts again "
            '(docs/llama-server.md, "Slot files")',
            self.profile,
            member.state.name,
            outcome.tokens,
        )

    def not_restoring(self, members: Sequence[PoolMember]) -> dict[str, str]:
        """The servers of ``members`` restored to no more, and why (``/v1/models``)."""
        out: dict[str, str] = {}
        for member in members:
            known = self._identities.get(member.state.name)
            if known is not None and known[1] in self._not_restoring:
                out[member.state.name] = self._not_restoring[known[1]]
        return out

    # -- saving

    async def save(self, member: PoolMember, index: int, leaving: Occupant) -> float | None:
        """Save slot ``index`` of ``member`` as ``leaving``'s file; the milliseconds it
        took, None where it could not be saved (logged: the conversation is evaluated
        again on its next call, as without slot files)."""
        folder = member.slot_dir
        if folder is None:
            return None
        meter = self._meter(member, leaving)
        saved = await self._save(member, index, leaving, folder)
        if meter is not None:
            if saved is None:
                meter.error(SlotNotSaved(f"slot {index} of {member.state.name} was not saved"))
            else:
                meter.record.slot_save_ms = saved[0]
                meter.record.adjustments = {"slot_tokens_saved": saved[1]}
                meter.ok()
        return saved[0] if saved is not None else None

    def _meter(self, member: PoolMember, leaving: Occupant) -> Meter | None:
        """A save's record: the gateway's own work for the conversation's task."""
        if self.records is None:
            return None
        task = leaving.conversation[0]
        meter = Meter(self.records, CallContext.new(task, SLOT_SAVE_PURPOSE), self.profile)
        record = meter.record
        record.provider = "local"
        record.server = member.state.name
        record.attempts = 1
        return meter

    async def _save(
        self, member: PoolMember, index: int, leaving: Occupant, folder: Path
    ) -> tuple[float, int] | None:
        started = time.monotonic()
        identity = await self.identity(member)
        if identity is None:
            return None
        name = self.name_of(leaving.conversation, leaving.group)
        filename = f"{name}.save-{os.getpid()}-{time.monotonic_ns()}.slot"
        try:
            answer = await self._api.save_slot(member.root(), index, filename)
        except (GatewayError, ServerRefused, MalformedAnswer) as exc:
            self.counts.save_failures += 1
            log.warning(
                "model %s: %s did not save slot %d: %s",
                self.profile,
                member.state.name,
                index,
                _said(exc),
            )
            with contextlib.suppress(OSError):
                (folder / filename).unlink()
            return None
        saved = count_or_none(answer.get("n_saved")) or 0
        path = folder / filename
        if saved == 0:
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        task = leaving.conversation[0]
        try:
            about = Saving(name, task, identity, saved, min(leaving.tokens, saved) or saved)
            await self.store.adopt(path, about)
        except OSError as exc:
            self.counts.save_failures += 1
            log.warning("model %s: a saved slot cannot be kept: %s", self.profile, exc)
            return None
        self.counts.saves += 1
        return round((time.monotonic() - started) * 1000, 1), saved

    async def save_left(
        self,
        members: Sequence[PoolMember],
        arriving: PoolMember,
        conversation: SlotKey,
        group: str | None,
    ) -> float | None:
        """Save ``conversation``'s slot on the servers other than ``arriving`` that hold
        tokens of it not in its file (a rebalance leaves a server that is up), so that
        its restore on ``arriving`` finds all of it; the milliseconds it took, if any."""
        for member in members:
            table = member.slots
            if member is arriving or table is None or member.slot_dir is None:
                continue
            if not member.running():
                continue
            held = table.hold_conversation(group, conversation)
            if held is None:
                continue
            index, occupant = held
            try:
                saved_ms = await self.save(member, index, occupant)
                if saved_ms is not None:
                    table.saved(index)
                    return saved_ms
            finally:
                table.release(index)
        return None

    def newer(self, conversation: SlotKey, group: str | None, tokens: int) -> bool:
        """Whether ``conversation``'s file holds more of it than the ``tokens`` a slot
        still holds (the conversation went on on another server since)."""
        entry = self.store.get(self.name_of(conversation, group))
        return entry is not None and entry.prefix_tokens >= tokens + MIN_RESTORE_TOKENS

    # -- restoring

    async def restore(
        self, member: PoolMember, index: int, conversation: SlotKey, group: str | None
    ) -> RestoreOutcome | None:
        """Load ``conversation``'s file into slot ``index`` of ``member``; None where it
        has none (or the server is not restored to)."""
        name = self.name_of(conversation, group)
        entry = self.store.get(name)
        folder = member.slot_dir
        if entry is None or folder is None or entry.tokens < MIN_RESTORE_TOKENS:
            return None
        if not self.restoring(member):
            return None
        identity = await self.identity(member)
        if identity is None:
            return None
        started = time.monotonic()
        checked = await self.store.check_out(name, identity, folder)
        if isinstance(checked, str):
            if checked in ("cut", "corrupt", "foreign"):
                await self.store.remove(name)  # it would be refused again
            return self._refused(member, name, checked, REFUSALS[checked])
        entry, linked = checked
        tps = member.state.prefill_tps or ASSUMED_PREFILL_TPS
        limit = max(RESTORE_TIME_FLOOR_S, entry.tokens / tps)
        try:
            async with asyncio.timeout(limit):
                answer = await self._api.restore_slot(member.root(), index, linked)
        except TimeoutError:
            return self._refused(member, name, None, f"the restore took over {limit:.1f} s")
        except ServerRefused as exc:
            await self.store.remove(name)
            return self._refused(member, name, None, f"the server refused it: {_said(exc)}")
        except (GatewayError, MalformedAnswer) as exc:
            return self._refused(member, name, None, _said(exc))
        finally:
            await self.store.check_in(folder, linked)
        restored = count_or_none(answer.get("n_restored")) or 0
        if restored == 0:
            return self._refused(member, name, None, "the server restored no token")
        self.counts.restores += 1
        return RestoreOutcome(
            tokens=restored,
            expected=min(entry.prefix_tokens, restored),
            restore_ms=round((time.monotonic() - started) * 1000, 1),
        )

    def _refused(
        self, member: PoolMember, name: str, cause: str | None, reason: str
    ) -> RestoreOutcome:
        self.counts.refused += 1
        log.warning(
            "model %s: slot file %s not restored on %s: %s",
            self.profile,
            name,
            member.state.name,
            reason,
        )
        return RestoreOutcome(refused=cause or reason)

    # -- in the background, and before the servers stop

    async def save_idle(self, members: Sequence[PoolMember]) -> int:
        """Save each slot whose conversation has been idle ``idle_save_s``; how many."""
        return await self._save_where(members, self.idle_save_s)

    async def save_all(self, members: Sequence[PoolMember]) -> int:
        """Save every slot holding unsaved tokens (the servers are about to stop)."""
        return await self._save_where(members, 0.0)

    async def _save_where(self, members: Sequence[PoolMember], idle_s: float) -> int:
        saved = 0
        for member in members:
            table = member.slots
            if table is None or member.slot_dir is None or not member.running():
                continue
            for index in table.idle_unsaved(idle_s):
                occupant = table.hold_unsaved(index)
                if occupant is None:
                    continue
                try:
                    if await self.save(member, index, occupant) is not None:
                        table.saved(index)
                        saved += 1
                finally:
                    table.release(index)
        return saved


class SlotNotSaved(GatewayError):
    """A slot save's record when the slot could not be saved (the reason is logged)."""

    status = 502
    default_code = "slot_not_saved"


def _said(exc: Exception) -> str:
    if isinstance(exc, ServerRefused):
        return f"HTTP {exc.status} {exc.body[:200].decode(errors='replace')}"
    if isinstance(exc, GatewayError):
        return exc.message
    return str(exc)
