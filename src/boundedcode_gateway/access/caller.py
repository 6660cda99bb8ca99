"""The authenticated caller of one request: what ingress learned from its credential.

Built once by ingress from the ``Authorization`` header and passed down in the
call's context; budgets and metering read it, nothing recomputes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from boundedcode_gateway.config import BudgetSettings

CallerKind = Literal["key", "token"]
ANY_MODEL = "*"


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
