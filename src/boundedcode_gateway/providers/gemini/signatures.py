"""Gemini's thought signatures: what is kept of an answer, and where it goes back (pure).

An answer's signatures are kept by slot, not by the position of the part Gemini
wrote: slot ``k`` is the answer's ``k``-th function call, slot ``TEXT_SLOT`` the
text part (a signature on a text, thought or signature-only part). The gateway
rebuilds an assistant turn as one text part and its function calls, so a slot
names the same part in every later request. Nothing here reads the store
itself; the adapter passes a lookup that already checked who wrote the turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from boundedcode_gateway.upstream.metrics import CapturedReasoning

SIGNATURE_KIND = "gemini_signature"
# the value Gemini's documentation allows for a function call it did not write
PLACEHOLDER = "skip_thought_signature_validator"
TEXT_SLOT = -1


@dataclass(frozen=True, slots=True)
class TurnSignatures:
    """One assistant turn's signatures by slot, and whether its tool-call ids are Gemini's."""

    slots: dict[int, str]
    native_ids: bool = False

    def to_data(self) -> dict[str, Any]:
        """The JSON kept in the store (``gemini-signatures.jsonl``)."""
        return {"slots": [[k, s] for k, s in sorted(self.slots.items())], "ids": self.native_ids}

    @classmethod
    def from_data(cls, data: Any) -> TurnSignatures | None:
        """The stored JSON back; None for anything this version did not write."""
        if not isinstance(data, dict) or not isinstance(data.get("slots"), list):
            return None
        slots: dict[int, str] = {}
        for entry in data["slots"]:
            if (
                isinstance(entry, list)
                and len(entry) == 2
                and isinstance(entry[0], int)
                and isinstance(entry[1], str)
            ):
                slots[entry[0]] = entry[1]
        return cls(slots, data.get("ids") is True)


SignatureLookup = Callable[[Sequence[str]], TurnSignatures | None]


def no_signatures(keys: Sequence[str]) -> TurnSignatures | None:
    """A lookup that knows no turn."""
    return None


class SignatureCollector:
    """Collects the signatures of one answer as its parts arrive (streamed or whole)."""

    __slots__ = ("_slots",)

    def __init__(self) -> None:
        self._slots: dict[int, str] = {}

    def add(self, signature: Any, call_index: int | None) -> None:
        """A part's ``thoughtSignature``; ``call_index`` when the part is a function call."""
        if not isinstance(signature, str) or not signature:
            return
        # a text answer may carry several (one per text chunk): the last one is kept
        self._slots[TEXT_SLOT if call_index is None else call_index] = signature

    def captured(
        self, tool_call_ids: list[str], text: str, native_ids: bool
    ) -> CapturedReasoning | None:
        """What the store keeps of this answer; None when there is nothing to give back."""
        if not self._slots and not native_ids:
            return None
        data = TurnSignatures(dict(self._slots), native_ids).to_data()
        return CapturedReasoning(SIGNATURE_KIND, list(tool_call_ids), text, data)


def apply_to_parts(parts: list[dict[str, Any]], signatures: TurnSignatures) -> None:
    """Put each stored signature back on the part of the rebuilt turn it was written on."""
    calls = [p for p in parts if "functionCall" in p]
    texts = [p for p in parts if "text" in p]
    for slot, signature in signatures.slots.items():
        if slot == TEXT_SLOT:
            if texts:
                texts[-1]["thoughtSignature"] = signature
        elif 0 <= slot < len(calls):
            calls[slot]["thoughtSignature"] = signature


def _opens_turn(content: dict[str, Any]) -> bool:
    """A user content with something besides function responses starts a new turn."""
    return content.get("role") == "user" and any(
        "functionResponse" not in p for p in content.get("parts", ())
    )


def add_placeholders(contents: list[dict[str, Any]]) -> int:
    """Sign each unsigned function-call step of the current turn with the placeholder.

    Gemini validates only the current turn: the model contents after the last user
    content with normal content. Returns how many steps got the placeholder.
    """
    start = 0
    for i in range(len(contents) - 1, -1, -1):
        if _opens_turn(contents[i]):
            start = i + 1
            break
    added = 0
    for content in contents[start:]:
        if content.get("role") != "model":
            continue
        first_call = next((p for p in content["parts"] if "functionCall" in p), None)
        if first_call is not None and "thoughtSignature" not in first_call:
            first_call["thoughtSignature"] = PLACEHOLDER
            added += 1
    return added
