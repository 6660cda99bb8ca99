"""The measured matrix of the agents' runs: `python -m tests.agents.matrix` prints, from
test-artifacts/agents/ (written by the agents' tests), upstream by agent by break point →
pass or what failed, with the gateway fronts each agent spoke and what the agent saw."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

from tests.agents.scripted_model import BreakPoint

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "agents"


def rows(folder: Path) -> list[dict[str, Any]]:
    order = {p.value: i for i, p in enumerate(BreakPoint)}
    found = [orjson.loads(f.read_bytes()) for f in sorted(folder.glob("*.json"))]
    for r in found:
        r.setdefault("upstream", "llama.cpp")  # artifacts from before the cloud runs
    return sorted(
        found,
        key=lambda r: (r["upstream"] != "llama.cpp", r["agent"], order.get(r["break_at"], 99)),
    )


def table(found: list[dict[str, Any]]) -> str:
    out = [
        "| upstream | agent | front | break point | result | what the agent saw |",
        "|---|---|---|---|---|---|",
    ]
    for r in found:
        fronts = ", ".join(r.get("fronts") or []) or "-"
        saw = str(r.get("saw", "")).replace("|", "\\|")
        cells = [r["upstream"], r["agent"], fronts, r["break_at"], r["verdict"], saw]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    print(table(rows(Path(sys.argv[1]) if len(sys.argv) > 1 else ARTIFACTS)))
