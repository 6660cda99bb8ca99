"""The authenticated caller of one request: what ingress learned from its credential.

Built once by ingress from the ``Authorization`` header and passed down in the
call's context; budgets and metering read it, nothing recomputes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from boundedcode_gateway.config import BudgetSettings, ReasoningSharing

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
