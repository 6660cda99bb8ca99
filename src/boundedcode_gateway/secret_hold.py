"""A streamed answer's text checked for the profile's key across its deltas (pure).

The relay redacts what it sends a caller batch by batch (``errors.redact_bytes``), so
a key an upstream writes across two deltas of text (``sk-ab`` then ``cd…``) would reach
the caller in two halves, each harmless alone and the key once joined. Here the text of
each content, reasoning and refusal delta is scanned with what came before it: the end
of a delta that could still be the beginning of a key is held back, and given with the
next delta of the same text (joined to it, so a key across them is seen whole and
replaced with ``***``), or in a chunk of its own at the finish.

``TextHold`` is the scan: what it releases, over any split of a text, is what the same
redaction of the whole text gives. ``SecretHold`` wraps one streamed answer's
translator, outermost (so every front and every provider's deltas pass it, as chat
chunks); the relay installs it only for a profile with a key, so a stream without one
pays nothing. It keeps two strings per text and no object per chunk; each chunk is read
once more (orjson) to find its text.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from boundedcode_gateway.errors import REDACTED
from boundedcode_gateway.providers.base import PartialAnswer
from boundedcode_gateway.upstream.metrics import CallMetrics

# the deltas whose text the caller reads; each is held apart from the others
TEXT_KEYS = ("content", "reasoning_content", "refusal")
_HEAD_KEYS = ("id", "object", "created", "model", "system_fingerprint")


@functools.lru_cache(maxsize=64)
def _secrets_pattern(secrets: tuple[str, ...]) -> re.Pattern[str]:
    # the longest first: where two keys begin at one place, the longer is the one taken
    ordered = sorted(set(secrets), key=len, reverse=True)
    return re.compile("|".join(re.escape(s) for s in ordered))


class TextHold:
    """One text's scan for ``secrets`` across its pieces (non-empty keys)."""

    __slots__ = ("_firsts", "_longest", "_pattern", "_secrets", "held")

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self._secrets = tuple(s for s in secrets if s)
        self._pattern = _secrets_pattern(self._secrets)
        self._longest = max((len(s) for s in self._secrets), default=0)
        self._firsts = frozenset(s[0] for s in self._secrets)
        # the end of the text so far that may still begin a key: not released yet
        self.held = ""

    def whole(self, text: str) -> str:
        """``text`` redacted as one piece (what any split of it releases in all)."""
        return self._pattern.sub(REDACTED, text) if self._secrets else text

    def feed(self, piece: str) -> str:
        """The text that can be released now, redacted; what may begin a key is kept."""
        if not self._secrets:
            return piece
        text = self.held + piece if self.held else piece
        out: list[str] = []
        pos = 0
        window = len(text) - self._longest + 1  # a key begun before it would end in the text
        for match in self._pattern.finditer(text):
            cut = self._undecided(text, max(pos, window), match.start() + 1)
            if cut is not None:
                return self._keep(text, out, pos, cut)
            out += (text[pos : match.start()], REDACTED)
            pos = match.end()
        cut = self._undecided(text, max(pos, window), len(text))
        return self._keep(text, out, pos, len(text) if cut is None else cut)

    def finish(self) -> str:
        """What is held, redacted: the text ended, so it begins no key."""
        held, self.held = self.held, ""
        return self.whole(held) if held else ""

    def _keep(self, text: str, out: list[str], pos: int, cut: int) -> str:
        self.held = text[cut:]
        out.append(text[pos:cut])
        return "".join(out)

    def _undecided(self, text: str, start: int, end: int) -> int | None:
        """The first place in ``[start, end)`` from which the rest of ``text`` is the
        beginning of a longer key: whether a key is there depends on what comes next."""
        first: int | None = None
        for char in self._firsts:
            at = text.find(char, start, end)
            while at != -1 and (first is None or at < first):
                rest = text[at:]
                if any(len(s) > len(rest) and s.startswith(rest) for s in self._secrets):
                    first = at
                    break
                at = text.find(char, at + 1, end)
        return first


class HeldTranslator(Protocol):
    """What the relay reads of its translator (``tool_call_hold.ToolCallHold``)."""

    @property
    def metrics(self) -> CallMetrics: ...

    @property
    def content_started(self) -> bool: ...

    @property
    def finished(self) -> bool: ...

    @property
    def progress_seen(self) -> bool: ...

    @property
    def generating(self) -> bool: ...

    def shown_text(self) -> PartialAnswer | None: ...

    def feed(self, event: str, data: bytes) -> Sequence[bytes]: ...


class SecretHold:
    """A stream translator whose text never gives a key away across its deltas."""

    __slots__ = ("_done", "_head", "_holds", "_inner")

    def __init__(self, inner: HeldTranslator, secrets: tuple[str, ...]) -> None:
        self._inner = inner
        self._holds = {key: TextHold(secrets) for key in TEXT_KEYS}
        # the head (id, time, model) of the stream's chunks, for a held text's own chunk
        self._head: dict[str, Any] = {}
        self._done = False

    @property
    def metrics(self) -> CallMetrics:
        return self._inner.metrics

    @property
    def content_started(self) -> bool:
        return self._inner.content_started

    @property
    def finished(self) -> bool:
        return self._inner.finished

    @property
    def progress_seen(self) -> bool:
        return self._inner.progress_seen

    @property
    def generating(self) -> bool:
        return self._inner.generating

    def shown_text(self) -> PartialAnswer | None:
        """What the caller was shown: the inner translator's text without what is held
        (an upstream asked to go on from it writes the held end again)."""
        shown = self._inner.shown_text()
        content, reasoning = self._holds["content"].held, self._holds["reasoning_content"].held
        if shown is None or not (content or reasoning):
            return shown
        shown = dataclasses.replace(
            shown,
            content=_without_end(shown.content, content),
            reasoning=_without_end(shown.reasoning, reasoning),
        )
        return shown if shown.content or shown.reasoning else None

    def feed(self, event: str, data: bytes) -> Sequence[bytes]:
        out = self._inner.feed(event, data)
        if not out and (self._done or not self._inner.finished):
            return out
        kept: list[bytes] = []
        after_text = 0  # where in ``kept`` text held now would go: after the last text
        for payload in out:
            if self._take(payload, kept, after_text):
                after_text = len(kept)
        if self._inner.finished and not self._done:
            self._release_at(kept, after_text)  # an end with no finish chunk ([DONE] alone)
        return kept

    def _take(self, payload: bytes, kept: list[bytes], after_text: int) -> bool:
        """Relay ``payload`` with its text scanned; whether it carried text."""
        obj = orjson.loads(payload)
        choices = obj.get("choices") if isinstance(obj, dict) else None
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            kept.append(payload)
            return False
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        if choice.get("finish_reason") and not self._done:
            # the texts end here: what this chunk does not go on with goes out before it
            self._release_at(kept, after_text, but=delta)
        carried = changed = False
        for key in TEXT_KEYS:
            text = delta.get(key)
            if not isinstance(text, str):
                continue
            hold = self._holds[key]
            # once the answer is finished nothing can join a text: it is released whole
            released = hold.feed(text) + hold.finish() if self._done else hold.feed(text)
            carried = True
            if released != text:
                delta[key] = released
                changed = True
            if hold.held and not self._head:
                # one stream, one head (its id, time and model): taken once, not per chunk
                self._head = {k: obj[k] for k in _HEAD_KEYS if k in obj}
        kept.append(orjson.dumps(obj) if changed else payload)
        return carried

    def _release_at(self, kept: list[bytes], at: int, but: dict[str, Any] | None = None) -> None:
        """From now on every text is whole: what is held (of the texts ``but`` does not
        carry on) goes out in a chunk of its own at ``at``."""
        self._done = True
        delta = {
            key: text
            for key, hold in self._holds.items()
            if not (but and isinstance(but.get(key), str)) and (text := hold.finish())
        }
        if delta:
            choice = {"index": 0, "delta": delta, "finish_reason": None}
            kept.insert(at, orjson.dumps({**self._head, "choices": [choice]}))


def _without_end(text: str, end: str) -> str:
    return text[: len(text) - len(end)] if end and text.endswith(end) else text
