"""The ways a workload reaches the server, one after the other in a run.

- ``gateway-auto``: a bounded-mode caller (it drops ``reasoning_content``) through the
  gateway, ``reasoning_history: auto`` (the gateway restores the reasoning);
- ``gateway-drop``: the same with ``reasoning_history: drop``;
- ``litellm``: the same caller through the LiteLLM proxy in front of the same server;
- ``direct-keep``: a caller that keeps its own ``reasoning_content``, straight to the
  server: the ideal the others are measured against.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mode:
    name: str
    front: str  # "gateway" | "litellm" | "direct"
    keep_reasoning: bool  # the caller sends its answers back with their reasoning
    reasoning_history: str | None = None  # the gateway profile's setting

    @property
    def metered_by_gateway(self) -> bool:
        return self.front == "gateway"


MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode("gateway-auto", "gateway", keep_reasoning=False, reasoning_history="auto"),
        Mode("gateway-drop", "gateway", keep_reasoning=False, reasoning_history="drop"),
        Mode("litellm", "litellm", keep_reasoning=False),
        Mode("direct-keep", "direct", keep_reasoning=True),
    )
}
IDEAL = "direct-keep"
