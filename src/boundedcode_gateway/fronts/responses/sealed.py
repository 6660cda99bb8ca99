"""A reasoning item's ``encrypted_content``: the answer's reasoning text, sealed with the
profile that wrote it, so the caller can give it back without the gateway storing it.

Pure (the ``Sealer`` holds the keys, and binds the seal to the call's task and caller
scope). What the gateway did not seal, or sealed for another profile, task or caller,
opens to nothing: reasoning goes back only to the model that wrote it, in the
conversation it was written for (docs/reasoning.md, Provenance).
"""

from __future__ import annotations

import orjson

from boundedcode_gateway.fronts.sealing import Sealer

# the sealed payload's version, so a later form can be told from this one
_VERSION = 1


def seal_reasoning(sealer: Sealer, model: str, reasoning: str) -> str:
    """``encrypted_content`` for ``reasoning`` that the profile ``model`` wrote."""
    return sealer.seal(orjson.dumps({"v": _VERSION, "m": model, "r": reasoning}))


def open_reasoning(sealer: Sealer, model: str, token: object) -> str | None:
    """The reasoning text in ``token`` when this gateway sealed it for ``model``; else None."""
    if not isinstance(token, str):
        return None
    data = sealer.open(token)
    if data is None:
        return None
    try:
        sealed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(sealed, dict) or sealed.get("v") != _VERSION or sealed.get("m") != model:
        return None
    reasoning = sealed.get("r")
    return reasoning if isinstance(reasoning, str) else None
