"""Which slot of a server a call runs in, and what each slot holds.

llama-server reuses whatever its slot already holds of a prompt (the common prefix, in
``cached_tokens`` and in the time the answer takes). The gateway pins each call to a
slot (``id_slot``) chosen here, so that a conversation finds its own tokens again:
the slot that holds it, else an empty one, else the least recently used one, whose
conversation is saved to its slot file first when it holds tokens its file does not
(``SlotGrant.leaving``; docs/llama-server.md, "Slot files"). A conversation is a task,
a purpose and the first message of its requests, so a client's side requests (a
title, a summary) are conversations of their own and do not take the agent's slot.

When a profile isolates its prompt cache, a slot is also owned by one group of calls
at a time (one caller key, or one task: ``cache_isolation``): a group's own slots come
first, and a slot that passes to another group is erased first
(``POST /slots/{id}?action=erase``), so the new group starts cold. The table is the
gateway's own view: the server has the gateway's key alone, so every request that
uses a slot goes through it.

No I/O here: the table hands out slots and says which must be saved or erased; the
pool does it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

# (task, purpose, a digest of the requests' first message): one conversation's calls
SlotKey = tuple[str, str, str]


@dataclass(slots=True)
class _Slot:
    # the group whose prompts the slot may hold, under isolation (None: not known)
    owner: str | None = None
    # the conversation whose tokens the slot holds (None: nothing known)
    conversation: SlotKey | None = None
    in_use: bool = False
    # the table's tick when it was last taken: the least recent goes to another
    last_used: int = 0
    # it holds tokens of its conversation that its slot file does not
    unsaved: bool = False
    # of them, what the conversation's next call is to find cached
    tokens: int = 0
    # monotonic: when its last call or repair ended
    idle_since: float = 0.0


@dataclass(frozen=True, slots=True)
class Occupant:
    """A conversation a slot holds: whose, and how many of its tokens the next call of
    it is to find cached."""

    conversation: SlotKey
    group: str | None
    tokens: int


@dataclass(frozen=True, slots=True)
class SlotGrant:
    """A slot given to a call: its index on the server; whether it already holds the
    call's conversation, and how many of its tokens; the conversation leaving it with
    tokens not yet saved (to save before the call is sent); whether the server must
    erase it first (it held another group's prompts, or nothing known)."""

    index: int
    erase: bool
    resident: bool = False
    leaving: Occupant | None = None
    # of a resident conversation, what its next call is to find cached there: its file
    # may hold more (the conversation went on on another server since)
    tokens: int = 0


class SlotTable:
    """The slots of one server: the conversation (and, isolated, the group) each holds."""

    __slots__ = ("_clock", "_isolated", "_released", "_slots", "_tick", "generation")

    def __init__(
        self,
        count: int,
        *,
        isolated: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if count < 1:
            raise ValueError(f"a server has one slot or more, not {count}")
        self._slots = [_Slot() for _ in range(count)]
        self._isolated = isolated
        self._clock = clock
        self._tick = 0
        self._released: asyncio.Event | None = None
        # the server's start whose slots these are (a restarted server holds nothing)
        self.generation = 0

    def __len__(self) -> int:
        return len(self._slots)

    def owner(self, index: int) -> str | None:
        return self._slots[index].owner

    def conversation(self, index: int) -> SlotKey | None:
        return self._slots[index].conversation

    def in_use(self, index: int) -> bool:
        return self._slots[index].in_use

    def take(self, group: str | None, conversation: SlotKey) -> SlotGrant | None:
        """A free slot for a call of ``conversation`` (None: every slot is in use): the one
        that holds it; under isolation then one of its group's, the most recent; then one
        never used; then the least recently used."""
        slots = self._slots
        free = [i for i, s in enumerate(slots) if not s.in_use]
        if not free:
            return None
        resident = [i for i in free if slots[i].conversation == conversation]
        if self._isolated:
            resident = [i for i in resident if slots[i].owner == group]
        own = [i for i in free if slots[i].owner == group] if self._isolated else []
        if resident:
            index = max(resident, key=lambda i: slots[i].last_used)
        elif own:
            index = max(own, key=lambda i: slots[i].last_used)
        else:
            index = min(free, key=lambda i: (slots[i].last_used != 0, slots[i].last_used, i))
        slot = slots[index]
        erase = self._isolated and slot.owner != group
        holds = slot.conversation == conversation and not erase
        leaving = None
        if not holds and slot.unsaved and slot.conversation is not None:
            leaving = Occupant(slot.conversation, slot.owner, slot.tokens)
        self._tick += 1
        slot.in_use, slot.last_used = True, self._tick
        slot.owner = group
        held = slot.tokens if holds else 0
        if not holds:
            slot.conversation, slot.unsaved, slot.tokens = conversation, False, 0
        return SlotGrant(index, erase, holds, leaving, held)

    async def acquire(self, group: str | None, conversation: SlotKey) -> SlotGrant:
        """A slot for a call of ``conversation``, waiting for one to be released while
        every slot is in use (as the server itself would queue the call)."""
        while True:
            grant = self.take(group, conversation)
            if grant is not None:
                return grant
            if self._released is None:
                self._released = asyncio.Event()
            await self._released.wait()

    def take_own(self, index: int, group: str | None, conversation: SlotKey) -> bool:
        """Take slot ``index`` only if it is free and still holds ``conversation`` (of
        ``group``): the cache keeper's repair of an answer, which must write nowhere else."""
        slot = self._slots[index]
        if slot.in_use or slot.conversation != conversation or slot.owner != group:
            return False
        slot.in_use = True
        return True

    def filled(self, index: int, tokens: int) -> None:
        """The slot's conversation now holds ``tokens`` the next call is to find cached,
        which its file does not."""
        slot = self._slots[index]
        slot.unsaved, slot.tokens = True, tokens

    def restored(self, index: int, tokens: int) -> None:
        """The slot holds its conversation's file: nothing unsaved."""
        slot = self._slots[index]
        slot.unsaved, slot.tokens = False, tokens

    def release(self, index: int, *, erased: bool = True) -> None:
        """The call in slot ``index`` ended. ``erased=False``: the erase, save or restore
        before it failed, so what the slot holds is not known (under isolation it is
        erased before its next use)."""
        slot = self._slots[index]
        slot.in_use = False
        slot.idle_since = self._clock()
        if not erased:
            slot.owner, slot.conversation, slot.unsaved = None, None, False
        released, self._released = self._released, None
        if released is not None:
            released.set()  # every waiter looks again

    # -- saving what the slots hold

    def idle_unsaved(self, idle_s: float) -> list[int]:
        """The free slots holding unsaved tokens, idle for ``idle_s`` or longer."""
        since = self._clock() - idle_s
        return [
            i
            for i, s in enumerate(self._slots)
            if not s.in_use and s.unsaved and s.conversation is not None and s.idle_since <= since
        ]

    def hold_unsaved(self, index: int) -> Occupant | None:
        """Take slot ``index`` to save it, if it is free and holds unsaved tokens."""
        slot = self._slots[index]
        if slot.in_use or not slot.unsaved or slot.conversation is None:
            return None
        slot.in_use = True
        return Occupant(slot.conversation, slot.owner, slot.tokens)

    def hold_conversation(
        self, group: str | None, conversation: SlotKey
    ) -> tuple[int, Occupant] | None:
        """Take the free slot holding ``conversation``'s unsaved tokens (of ``group``,
        under isolation) to save it: the conversation is going on on another server."""
        for index, slot in enumerate(self._slots):
            if slot.conversation != conversation or (self._isolated and slot.owner != group):
                continue
            occupant = self.hold_unsaved(index)
            return None if occupant is None else (index, occupant)
        return None

    def saved(self, index: int) -> None:
        """The slot's tokens are in its conversation's file now (it is still held)."""
        self._slots[index].unsaved = False

    def emptied(self, generation: int) -> None:
        """The server started again (``generation``): its slots hold nothing."""
        self.generation = generation
        for slot in self._slots:
            slot.owner, slot.conversation, slot.unsaved, slot.tokens = None, None, False, 0
