"""The fronts a gateway serves, by the path of their calls (also under ``/tasks/{task}``)."""

from __future__ import annotations

from boundedcode_gateway.fronts.base import CHAT, Front
from boundedcode_gateway.fronts.messages import MessagesCountFront, MessagesFront
from boundedcode_gateway.fronts.responses import ResponsesFront
from boundedcode_gateway.fronts.sealing import Sealer


def fronts_by_path(sealer: Sealer) -> dict[str, Front]:
    """Every front, by its call's path; ``sealer`` signs and seals what callers give back."""
    return {
        "/v1/chat/completions": CHAT,
        "/v1/responses": ResponsesFront(sealer),
        "/v1/messages": MessagesFront(sealer),
        "/v1/messages/count_tokens": MessagesCountFront(sealer),
    }
