"""Who asks, for which task, and when: the authenticated caller of one request (what ingress
learned from its credential) and the call's context, built once by ingress and passed
down; budgets, metering and the stores read them, nothing recomputes them.

Low in the layers (the ``[tool.importlinter]`` contract in pyproject.toml): ingress, access,
metering and the stores all read these, so they sit below each of them.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from boundedcode_gateway.clock import utc_now_iso
from boundedcode_gateway.config import BudgetSettings, ReasoningSharing
from boundedcode_gateway.trace_context import TraceContext
from boundedcode_gateway.unique_ids import hex_id

# a task id: a folder's name under the data directory, hence no path separator
TASK_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")

CallerKind = Literal["key", "token"]
ANY_MODEL = "*"
# the scope of what everyone on a task shares: a gateway without keys, ``shared_by: task``,
# and what was stored before reasoning had a scope
TASK_SCOPE = "task"
# every token of a task: minted for the task's one runtime, by no key in particular
TOKENS_SCOPE = "tokens"


@dataclass(frozen=True, slots=True)
class Caller:
    """A caller key from ``auth.keys`` or a task-scoped token."""

    # the key's name, or the token's name ("token:<id>"): what the record shows
    name: str
    kind: CallerKind
    models: frozenset[str]
    admin: bool = False
    # a token is valid for this task only; None for a key
    task: str | None = None
    # the credential's own budget (a key's from the config, a token's from its claims)
    budget: BudgetSettings | None = None

    def may_use(self, model: str) -> bool:
        return ANY_MODEL in self.models or model in self.models


def reasoning_scope(caller: Caller | None, shared_by: ReasoningSharing) -> str:
    """Who on a task finds what a call keeps of its reasoning, and whose signatures and
    seals it accepts: the caller key by its name, the task's tokens together, or (without
    ``auth:``, or with ``shared_by: task``) everyone on the task."""
    if caller is None or shared_by == "task":
        return TASK_SCOPE
    if caller.kind == "token":
        return TOKENS_SCOPE
    # never equal to the other two: those have no colon
    return "key:" + caller.name


@dataclass(slots=True)
class CallContext:
    """Who asked and when: set by ingress before the body is read."""

    task: str
    purpose: str
    call_id: str
    started: float
    started_at: str
    # the caller sent X-BoundedCode-Stream-Discard: it understands the discard event
    discard_header: bool = False
    # who called, when the gateway has ``auth:`` (None otherwise)
    caller: Caller | None = None
    # the API the caller spoke (fronts/): "chat", "messages", "responses"
    front: str = "chat"
    # what the front changed of the request on its own account, for the record's
    # ``adjustments`` (a server tool left out, a newer API version served as a known one)
    adjustments: dict[str, Any] = field(default_factory=dict)
    # who on the task shares the call's stored reasoning and seals (``reasoning_scope`` above)
    scope: str = TASK_SCOPE
    # the call's span in its trace, when the gateway exports traces (observability:)
    trace: TraceContext | None = None

    @classmethod
    def new(
        cls,
        task: str,
        purpose: str,
        discard_header: bool = False,
        caller: Caller | None = None,
        front: str = "chat",
        scope: str = TASK_SCOPE,
        trace: TraceContext | None = None,
    ) -> CallContext:
        # 32 hex digits, the form uuid4().hex had
        call_id = f"call_{hex_id()}"
        return cls(
            task,
            purpose,
            call_id,
            time.perf_counter(),
            utc_now_iso(),
            discard_header,
            caller,
            front,
            scope=scope,
            trace=trace,
        )

    def elapsed_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000.0, 3)
