"""The cache repair measured on the real server: what each turn's caller waited for.

Starts the pinned llama-server with SmolLM2-135M and the Qwen3-style test template
(the repository's tests/fixtures/templates/qwen3_style.jinja), then the gateway
(``boundedcode-gateway serve``) in front of it, twice: with the repair and without.
Each time it runs the same conversations (one seed and one topic each, 8 turns, a
bounded-mode caller that drops reasoning_content, reasoning history ``auto``) and
prints, per turn, the prompt tokens the caller waited for, what the repair
evaluated after the answer, and the call's ``miss_cause`` from the call log.

A third run measures what a repair costs a caller who does not wait for it: each
next turn is sent, streamed, the moment the server shows the repair evaluating
(its slot busy), so the call abandons it; the time to its first token is set
beside the same turns' with the repair off, where the call is sent at once.

    make bench-cache-repair            # 10 conversations of 8 turns (3 for the arrivals)
    .venv/bin/python -m bench.cache_repair --conversations 3

Between two turns the caller waits until the gateway's follow-up of the answer is
done, as the time an agent spends on its tools would let it finish. Whatever was
started is stopped by PID in a ``finally``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench import real_server
from bench.cache_repair import token_exact
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE

BUDGET = {"reasoning_budget_tokens": 120, "max_tokens": 200, "temperature": 0.8}
TOPICS = (
    "a hash map",
    "a binary search tree",
    "a linked list",
    "a priority queue",
    "a bloom filter",
    "a B-tree",
    "a ring buffer",
    "a trie",
    "a skip list",
    "an LRU cache",
)
FOLLOW_UPS = (
    "Explain step by step how {t} stores an item.",
    "What happens when two items collide or compete in {t}?",
    "How does {t} grow?",
    "What does {t} cost in memory?",
    "Compare {t} with a plain array.",
    "What is a common mistake when implementing {t}?",
    "How do iterators behave on {t} while it changes?",
    "Summarise everything about {t} briefly.",
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.cache_repair", description=__doc__)
    p.add_argument("--conversations", type=int, default=10, help="at most 10")
    p.add_argument("--turns", type=int, default=8, help="at most 8")
    p.add_argument(
        "--parts",
        default="repair,arrivals,exact",
        help="comma-separated: repair (with and without), arrivals, exact (token ids)",
    )
    p.add_argument(
        "--arrival-conversations",
        type=int,
        default=3,
        help="conversations of the arrival measurement (at most --conversations)",
    )
    return p


@contextmanager
def gateway(data_dir: Path, server: str, repair: bool) -> Iterator[str]:
    profile = {"server": {"cache_repair": repair}}
    config = real_server.write_gateway_config(data_dir, server, profile)
    with real_server.gateway(config, data_dir) as url:
        yield url


def _followed(data_dir: Path, task: str, answers: int, repair: bool) -> None:
    """Wait for the answer's follow-up: its repair record, or (without repair) a pause."""
    if repair:
        real_server.wait_for_repairs(data_dir, task, answers)
    else:
        time.sleep(1.0)


def converse(
    url: str, data_dir: Path, task: str, topic: str, seed: int, turns: int, repair: bool
) -> None:
    history: list[dict[str, Any]] = []
    headers = {"X-BoundedCode-Task": task}
    with httpx.Client(base_url=url, headers=headers, timeout=300) as client:
        for i in range(turns):
            history.append({"role": "user", "content": FOLLOW_UPS[i].format(t=topic)})
            body = {"model": "local", "messages": history, **BUDGET, "seed": seed}
            answer = client.post("/v1/chat/completions", json=body).json()
            message = answer["choices"][0]["message"]
            # a bounded-mode caller: the answer goes back without its reasoning
            history.append({"role": "assistant", "content": message.get("content") or ""})
            _followed(data_dir, task, i + 1, repair)


def _repair_running(server: str, deadline_s: float) -> bool:
    """Wait until the server's slot is busy with the repair; False if it never was."""
    deadline = time.monotonic() + deadline_s
    with httpx.Client(base_url=server, timeout=5) as client:
        while time.monotonic() < deadline:
            if any(s.get("is_processing") for s in client.get("/slots").json()):
                return True
            time.sleep(0.005)
    return False


def _streamed_ttft_ms(client: httpx.Client, body: dict[str, Any]) -> tuple[float, str]:
    """Time to the first content or reasoning delta, and the answer's text."""
    started = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if first is None and (delta.get("content") or delta.get("reasoning_content")):
                    first = time.perf_counter()
                text.append(delta.get("content") or "")
    return ((first or time.perf_counter()) - started) * 1000, "".join(text)


def arrivals(
    server: str, url: str, task: str, topic: str, seed: int, turns: int, repair: bool
) -> list[tuple[float, bool]]:
    """Per turn after the first: the caller's TTFT, and whether a repair was running."""
    history: list[dict[str, Any]] = []
    out: list[tuple[float, bool]] = []
    with httpx.Client(base_url=url, headers={"X-BoundedCode-Task": task}, timeout=300) as client:
        for i in range(turns):
            history.append({"role": "user", "content": FOLLOW_UPS[i].format(t=topic)})
            body = {"model": "local", "messages": history, **BUDGET, "seed": seed}
            running = i > 0 and repair and _repair_running(server, 2.0)
            ttft, text = _streamed_ttft_ms(client, body)
            if i:
                out.append((ttft, running))
            history.append({"role": "assistant", "content": text})
    return out


def measure_arrivals(
    root: Path, conversations: int, turns: int
) -> dict[bool, tuple[list[list[tuple[float, bool]]], list[dict[str, Any]]]]:
    """Each conversation with the repair off, then on, each on a fresh server: a change in
    the machine's load falls on both alike."""
    rows: dict[bool, list[list[tuple[float, bool]]]] = {False: [], True: []}
    for n in range(conversations):
        for repair in (False, True):
            data_dir = root / f"arrivals-{'repair' if repair else 'no-repair'}-{n + 1}"
            data_dir.mkdir()
            with real_server.llama_server(root) as server, gateway(data_dir, server, repair) as url:
                task = f"a{n + 1}"
                rows[repair].append(arrivals(server, url, task, TOPICS[n], 100 + n, turns, repair))
                time.sleep(0.5)
    calls = [c for d in sorted(root.glob("arrivals-repair-*")) for c in real_server.calls(d)]
    return {False: (rows[False], []), True: (rows[True], calls)}


def arrivals_table(
    without: list[list[tuple[float, bool]]],
    with_repair: list[list[tuple[float, bool]]],
    calls: list[dict[str, Any]],
) -> str:
    lines = [
        "| | turns | median TTFT ms | p90 TTFT ms |",
        "|---|---|---|---|",
    ]

    def row(name: str, values: list[float]) -> str:
        values = sorted(values)
        if not values:
            return f"| {name} | 0 | | |"
        p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
        return f"| {name} | {len(values)} | {values[len(values) // 2]:.1f} | {p90:.1f} |"

    lines.append(row("repair off, sent at once", [t for r in without for t, _ in r]))
    hit = [t for r in with_repair for t, running in r if running]
    lines.append(row("repair on, sent while it ran", hit))
    pairs = [
        b - a
        for r0, r1 in zip(without, with_repair, strict=True)
        for (a, _), (b, running) in zip(r0, r1, strict=True)
        if running
    ]
    abandoned = sum(
        c["purpose"] == REPAIR_PURPOSE and c["error_code"] == "abandoned" for c in calls
    )
    pairs.sort()
    added = f"{pairs[len(pairs) // 2]:+.1f} ms" if pairs else "n/a"
    return (
        "\n".join(lines)
        + f"\n\nsame turn, repair on minus off: median {added}; repairs abandoned: {abandoned}"
    )


def measure(server: str, root: Path, repair: bool, conversations: int, turns: int) -> list[Any]:
    data_dir = root / ("repair" if repair else "no-repair")
    data_dir.mkdir()
    with gateway(data_dir, server, repair) as url:
        for n in range(conversations):
            converse(url, data_dir, f"c{n + 1}", TOPICS[n], 100 + n, turns, repair)
        time.sleep(0.5)
    return real_server.calls(data_dir)


def _cell(call: dict[str, Any], repair: dict[str, Any] | None) -> str:
    cell = str(call["evaluated_tokens"])
    if repair is not None:
        cell += f" / {repair['evaluated_tokens']}"
    cause = call["miss_cause"]
    if cause not in ("none", "first_call"):
        cell += f" {cause}"
    if repair is not None and repair["miss_cause"] not in ("none", None):
        cell += f" (repaired {repair['miss_cause']})"
    return cell


def table(calls: list[dict[str, Any]], conversations: int, turns: int, repair: bool) -> str:
    head = "| conversation | " + " | ".join(f"turn {t + 1}" for t in range(turns)) + " |"
    lines = [head, "|---" * (turns + 1) + "|"]
    waited: list[int] = []
    causes: dict[str, int] = {}
    for n in range(conversations):
        task = f"c{n + 1}"
        turns_of = [c for c in calls if c["task"] == task and c["purpose"] == "agent_turn"]
        repairs = [c for c in calls if c["task"] == task and c["purpose"] == REPAIR_PURPOSE]
        cells = []
        for t, call in enumerate(turns_of):
            # the repair after turn t readies turn t + 1: shown beside what it readied
            before = repairs[t - 1] if repair and 0 < t <= len(repairs) else None
            cells.append(_cell(call, before))
            if t:
                waited.append(call["evaluated_tokens"])
                causes[call["miss_cause"]] = causes.get(call["miss_cause"], 0) + 1
        lines.append(f"| {task} ({TOPICS[n]}) | " + " | ".join(cells) + " |")
    waited.sort()
    summary = (
        f"turns 2-{turns}: {len(waited)}; prompt tokens waited for: median "
        f"{waited[len(waited) // 2]}, max {waited[-1]}, total {sum(waited)}; miss causes: "
        + ", ".join(f"{k} {v}" for k, v in sorted(causes.items()))
    )
    return "\n".join(lines) + "\n\n" + summary


def exact_table(evaluated: list[list[int]], turns: int) -> str:
    head = "| conversation | " + " | ".join(f"turn {t + 1}" for t in range(turns)) + " |"
    lines = [head, "|---" * (turns + 1) + "|"]
    for n, row in enumerate(evaluated):
        lines.append(f"| c{n + 1} ({TOPICS[n]}) | " + " | ".join(map(str, row)) + " |")
    later = sorted(v for row in evaluated for v in row[1:])
    summary = (
        f"turns 2-{turns}: {len(later)}; prompt tokens evaluated: median "
        f"{later[len(later) // 2]}, max {later[-1]}, total {sum(later)}"
    )
    return "\n".join(lines) + "\n\n" + summary


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    conversations = min(args.conversations, len(TOPICS))
    turns = min(args.turns, len(FOLLOW_UPS))
    arriving = min(args.arrival_conversations, conversations)
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory(prefix="bench-cache-repair-") as tmp:
        results = {}
        if "repair" in parts:
            for repair in (False, True):
                # a fresh server each time: no cache (slot or RAM) carries over
                with real_server.llama_server(Path(tmp)) as server:
                    results[repair] = measure(server, Path(tmp), repair, conversations, turns)
            print(
                "## Without the repair: prompt tokens each turn evaluated while the caller waited\n"
            )
            print(table(results[False], conversations, turns, repair=False))
            print("\n## With the repair: waited / evaluated by the repair before that turn\n")
            print(table(results[True], conversations, turns, repair=True), flush=True)
        if "arrivals" in parts:
            timed = measure_arrivals(Path(tmp), arriving, turns)
            print("\n## A call arriving while the repair runs: time to first token\n")
            print(arrivals_table(timed[False][0], timed[True][0], timed[True][1]), flush=True)
        if "exact" in parts:
            with real_server.llama_server(Path(tmp)) as server:
                exact = [
                    token_exact.converse(
                        server,
                        [q.format(t=TOPICS[n]) for q in FOLLOW_UPS[:turns]],
                        100 + n,
                        BUDGET,
                    )
                    for n in range(conversations)
                ]
            print("\n## Experiment: every prompt as token ids, sampled ids kept (no gateway)\n")
            print(exact_table(exact, turns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
