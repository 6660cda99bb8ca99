"""What a local server showed of itself, as the adapter that translates for it needs it.

The local fleet (``llama_server/fleet.py``) reads it once from llama.cpp's ``/props``
and its chat template; the OpenAI-shape adapter turns it into the profile's
``Capabilities`` and its requests' form. Neither side imports the other: both read
this value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ServerTraits:
    """A local profile's servers as read once (all alike: a pool's must agree)."""

    # whether the server answered ``/props`` as llama.cpp does; the fields below are
    # llama.cpp's, their defaults what another OpenAI-compatible server is taken to do
    llama_cpp: bool
    # the chat template keeps earlier reasoning (``supports_preserve_reasoning``)
    keeps_reasoning: bool = False
    # why earlier reasoning cannot go back, where the template drops it
    reasoning_refusal: str | None = None
    # sent with a reasoning budget where the template writes "\n</think>"
    budget_message: str | None = None
    # the template renders a system message after the start where it stands
    system_in_place: bool = False
    # the servers' command lines let them go on with a partial answer
    continues: bool = True
    context_tokens: int | None = None
    tools: bool = True
    vision: bool = False
    audio: bool = False
    video: bool = False


class LocalServers(Protocol):
    """What the adapter of a local profile is handed of the profile's servers."""

    async def traits(self) -> ServerTraits | None:
        """The servers' traits, read once; None while none can be read (asked again)."""
        ...

    async def readiness(self) -> str | None:
        """None when the servers can take calls now, else why not."""
        ...

    @property
    def pins_slots(self) -> bool:
        """Whether the gateway pins each call to a slot of its own choosing."""
        ...
