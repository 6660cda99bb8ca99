"""Which slot of a server a call runs in, when a profile isolates its prompt cache.

llama-server reuses whatever its slot already holds of a prompt (the common prefix, in
``cached_tokens`` and in the time the answer takes). A slot is therefore owned by one
group of calls at a time (one caller key, or one task: ``cache_isolation``), every
call is pinned to a slot of its group (``id_slot``), and a slot that passes to another
group is erased first (``POST /slots/{id}?action=erase``), so the new group starts
cold. The table is the gateway's own view: the server has the gateway's key alone, so
every request that uses a slot goes through it.

No I/O here: the table hands out slots and says which must be erased; the pool erases.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from boundedcode_gateway.pools.holdings import ConversationKey


@dataclass(slots=True)
class _Slot:
    # the group whose prompts the slot may hold (None: not known, erased before any use)
    owner: str | None = None
    # the conversation whose call used it last, of its owner
    conversation: ConversationKey | None = None
    in_use: bool = False
    # the table's tick when it was last taken: the least recent goes to another group
    last_used: int = 0


@dataclass(frozen=True, slots=True)
class SlotGrant:
    """A slot given to a call: its index on the server, and whether the server must erase
    it before the call is sent (it held another group's prompts, or nothing known)."""

    index: int
    erase: bool


class SlotTable:
    """The slots of one server and the group each belongs to."""

    __slots__ = ("_released", "_slots", "_tick")

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"a server has one slot or more, not {count}")
        self._slots = [_Slot() for _ in range(count)]
        self._tick = 0
        self._released: asyncio.Event | None = None

    def __len__(self) -> int:
        return len(self._slots)

    def owner(self, index: int) -> str | None:
        return self._slots[index].owner

    def in_use(self, index: int) -> bool:
        return self._slots[index].in_use

    def take(self, group: str, conversation: ConversationKey) -> SlotGrant | None:
        """A free slot for a call of ``group`` (None: every slot is in use). Of the group's
        own, the one its conversation used last, else the most recent; else one never
        used; else another group's, the least recently used, to be erased."""
        free = [i for i, s in enumerate(self._slots) if not s.in_use]
        if not free:
            return None
        slots = self._slots
        own = [i for i in free if slots[i].owner == group]
        if own:
            index = max(
                own, key=lambda i: (slots[i].conversation == conversation, slots[i].last_used)
            )
        else:
            index = min(free, key=lambda i: (slots[i].last_used != 0, slots[i].last_used, i))
        slot = slots[index]
        erase = slot.owner != group
        self._tick += 1
        slot.owner, slot.conversation = group, conversation
        slot.in_use, slot.last_used = True, self._tick
        return SlotGrant(index, erase)

    async def acquire(self, group: str, conversation: ConversationKey) -> SlotGrant:
        """A slot for a call of ``group``, waiting for one to be released while every slot
        is in use (as the server itself would queue the call)."""
        while True:
            grant = self.take(group, conversation)
            if grant is not None:
                return grant
            if self._released is None:
                self._released = asyncio.Event()
            await self._released.wait()

    def take_own(self, index: int, group: str) -> bool:
        """Take slot ``index`` only if it is free and still ``group``'s (the cache keeper's
        repair of an answer, which must write nowhere else)."""
        slot = self._slots[index]
        if slot.in_use or slot.owner != group:
            return False
        slot.in_use = True
        return True

    def release(self, index: int, *, erased: bool = True) -> None:
        """The call in slot ``index`` ended. ``erased=False``: the erase before it failed,
        so what the slot holds is not known and it is erased before its next use."""
        slot = self._slots[index]
        slot.in_use = False
        if not erased:
            slot.owner, slot.conversation = None, None
        released, self._released = self._released, None
        if released is not None:
            released.set()  # every waiter looks again
