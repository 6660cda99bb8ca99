"""How each attempt of a call ended, from its attempt log: the entries also say when and
where each went, which the tests that count outcomes leave aside."""

from __future__ import annotations

from typing import Any


def outcomes(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"status": a["status"], "code": a["code"]} for a in log]
