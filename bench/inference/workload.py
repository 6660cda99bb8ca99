"""A benchmark workload: what an agent-shaped caller adds at each step (bench/workloads/*.json).

Owns the file format and reading it back; it must not send anything. The format
(``"format": 1``) is described in bench/workloads/README.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

FORMAT_VERSION = 1
WORKLOADS_DIR = Path(__file__).resolve().parents[1] / "workloads"
# the token estimate every workload is sized by: characters / 3.5 (an assumption between
# prose and code, not measured with SmolLM2's tokenizer; see bench/workloads/README.md)
CHARS_PER_TOKEN = 3.5


def estimate_tokens(text: str) -> int:
    """The estimate the workloads are sized by: ``ceil(len(text) / 3.5)``."""
    return -(-len(text) * 2 // 7)


class WorkloadError(ValueError):
    """A workload file that does not follow the format."""


@dataclass(frozen=True, slots=True)
class Purpose:
    """One conversation of the task: its own system prompt and tools (``[]``: none)."""

    system: str
    tools: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Condense:
    """Before this step's input, the thread's turns ``first``..``last`` become ``summary``."""

    first: int
    last: int
    summary: str


@dataclass(frozen=True, slots=True)
class Step:
    """One call: the purpose (thread) it belongs to and the input the caller adds."""

    index: int  # 1-based, over the whole workload
    purpose: str
    turn: int  # 1-based, within the purpose
    kind: str  # what the input is: task, file_read, listing, test_output, ...
    text: str
    condense: Condense | None = None
    restart_before: bool = False  # the gateway is restarted before this step


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    description: str
    task: str
    seed: int
    max_tokens: int  # the answer budget the estimate assumes (the runner's max_tokens)
    purposes: Mapping[str, Purpose]
    steps: tuple[Step, ...]
    expected_history_rewrites: int


def _need(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise WorkloadError(f"{key!r} is missing or not {kind}")
    return value


def _step(raw: Mapping[str, Any], purposes: Mapping[str, Purpose]) -> Step:
    purpose = _need(raw, "purpose", str)
    if purpose not in purposes:
        raise WorkloadError(f"step {raw.get('index')}: unknown purpose {purpose!r}")
    condense = None
    if raw.get("condense") is not None:
        c = _need(raw, "condense", dict)
        condense = Condense(_need(c, "first", int), _need(c, "last", int), _need(c, "summary", str))
    return Step(
        index=_need(raw, "index", int),
        purpose=purpose,
        turn=_need(raw, "turn", int),
        kind=_need(raw, "kind", str),
        text=_need(raw, "text", str),
        condense=condense,
        restart_before=bool(raw.get("restart_before", False)),
    )


def _check_numbering(steps: Sequence[Step]) -> None:
    turns: dict[str, int] = {}
    for i, step in enumerate(steps, start=1):
        turns[step.purpose] = turns.get(step.purpose, 0) + 1
        if step.index != i or step.turn != turns[step.purpose]:
            raise WorkloadError(
                f"step {i}: index/turn numbering is off ({step.index}, {step.turn})"
            )
        c = step.condense
        if c is not None and not 1 < c.first <= c.last < step.turn - 1:
            raise WorkloadError(f"step {i}: cannot condense turns {c.first}-{c.last} here")


def parse_workload(data: Mapping[str, Any]) -> Workload:
    """A workload from its decoded JSON; ``WorkloadError`` names what is wrong."""
    if data.get("format") != FORMAT_VERSION:
        raise WorkloadError(f"format {data.get('format')!r} is not {FORMAT_VERSION}")
    purposes = {
        name: Purpose(_need(p, "system", str), tuple(_need(p, "tools", list)))
        for name, p in _need(data, "purposes", dict).items()
    }
    steps = tuple(_step(s, purposes) for s in _need(data, "steps", list))
    _check_numbering(steps)
    return Workload(
        name=_need(data, "name", str),
        description=_need(data, "description", str),
        task=_need(data, "task", str),
        seed=_need(data, "seed", int),
        max_tokens=_need(data, "max_tokens", int),
        purposes=purposes,
        steps=steps,
        expected_history_rewrites=_need(data, "expected_history_rewrites", int),
    )


def load_workload(name_or_path: str | Path) -> Workload:
    """A shipped workload by name (``tool-loop``) or any workload file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = WORKLOADS_DIR / f"{name_or_path}.json"
    return parse_workload(orjson.loads(path.read_bytes()))
