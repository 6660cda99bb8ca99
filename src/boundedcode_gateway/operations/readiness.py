"""``GET /ready``: whether every model profile can take calls now, and why not where not."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from boundedcode_gateway.providers.base import Upstream

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Readiness:
    """Each profile's reason not to be ready (None: ready)."""

    reasons: dict[str, str | None]

    @property
    def ready(self) -> bool:
        return all(reason is None for reason in self.reasons.values())

    @property
    def status(self) -> int:
        return 200 if self.ready else 503

    def to_json(self) -> dict[str, Any]:
        models: dict[str, Any] = {}
        for name, reason in self.reasons.items():
            models[name] = {"ready": True} if reason is None else {"ready": False, "reason": reason}
        return {"status": "ready" if self.ready else "not_ready", "models": models}


async def readiness(upstreams: Mapping[str, Upstream]) -> Readiness:
    """Ask every profile at once (each check is cheap, or a short probe kept for a moment)."""
    found = await asyncio.gather(
        *(u.readiness() for u in upstreams.values()), return_exceptions=True
    )
    reasons: dict[str, str | None] = {}
    for name, result in zip(upstreams, found, strict=True):
        if isinstance(result, BaseException):
            if isinstance(result, asyncio.CancelledError):
                raise result
            log.warning("model %s: readiness check failed: %r", name, result)
            reasons[name] = "its readiness check failed (see the gateway's log)"
        else:
            reasons[name] = result
    return Readiness(reasons)
