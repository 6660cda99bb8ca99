"""What a per-request nonce in the system prompt costs a local server, with and without
the gateway's rule that removes it (policy/volatile_lines.py).

One 10-turn conversation shaped as Claude Code sends it: the first system block is its
billing header, whose ``cch=`` value is new on every request, then a long system
prompt; each turn adds the model's answer and a new question. It runs twice on the
pinned llama-server with the small model, each time on a fresh server: sent to the
server directly (the nonce reaches the template), then through the gateway (the rule
removes the line). The prompt tokens the server evaluated for each turn are read from
its ``/metrics`` counter ``llamacpp:prompt_tokens_total`` before and after the turn
(the gateway's cache repair is off, so that only the turns' own evaluation counts).

Run: ``python -m bench.volatile_lines [--turns N]`` (``make bench-volatile-lines``).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench import real_server

RULES = " ".join(
    f"{i}. Read a file before you change it, and keep each edit to the lines that are wrong."
    for i in range(1, 40)
)
SYSTEM = f"You are Claude Code, Anthropic's official CLI for Claude.\n\n# Rules\n{RULES}"
QUESTIONS = [
    "List the files of the project.",
    "Read setup.py.",
    "What does the package export?",
    "Find the failing test.",
    "Read the test's file.",
    "What does the assertion check?",
    "Read the function it calls.",
    "Where is the off-by-one?",
    "Write the fix as a one-line diff.",
    "Say what you changed.",
]


def billing_line(rng: random.Random) -> str:
    nonce = f"{rng.getrandbits(20):05x}"
    return f"x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch={nonce};"


def prompt_tokens_total(server: httpx.Client) -> float:
    for line in server.get("/metrics").text.splitlines():
        if line.startswith("llamacpp:prompt_tokens_total "):
            return float(line.split()[1])
    raise RuntimeError("llama-server's /metrics has no llamacpp:prompt_tokens_total")


def converse(url: str, server: httpx.Client, turns: int, seed: int) -> list[int]:
    """The prompt tokens the server evaluated for each turn."""
    rng = random.Random(seed)
    history: list[dict[str, Any]] = []
    evaluated: list[int] = []
    with httpx.Client(timeout=600) as client:
        for question in QUESTIONS[:turns]:
            history.append({"role": "user", "content": question})
            system = {
                "role": "system",
                "content": [
                    {"type": "text", "text": billing_line(rng)},
                    {"type": "text", "text": SYSTEM},
                ],
            }
            body = {
                "model": "local",
                "messages": [system, *history],
                "max_tokens": 24,
                "temperature": 0,
                "seed": seed,
            }
            before = prompt_tokens_total(server)
            resp = client.post(url + "/v1/chat/completions", json=body)
            resp.raise_for_status()
            evaluated.append(int(prompt_tokens_total(server) - before))
            content = resp.json()["choices"][0]["message"].get("content") or ""
            history.append({"role": "assistant", "content": content})
    return evaluated


def run(way: str, turns: int, seed: int, run_dir: Path) -> list[int]:
    folder = run_dir / way
    folder.mkdir(parents=True)
    with (
        real_server.llama_server(folder) as url,
        httpx.Client(base_url=url, timeout=30) as server,
    ):
        if way == "direct":
            return converse(url, server, turns, seed)
        data_dir = folder / "gateway"
        data_dir.mkdir()
        profile = {"server": {"cache_repair": False}}
        config = real_server.write_gateway_config(data_dir, url, profile)
        with real_server.gateway(config, folder) as gateway_url:
            return converse(gateway_url, server, turns, seed)


def table(direct: list[int], gateway: list[int]) -> str:
    lines = [
        "| turn | evaluated, nonce kept (direct) | evaluated, nonce removed (gateway) |",
        "|---:|---:|---:|",
    ]
    for i, (d, g) in enumerate(zip(direct, gateway, strict=True), 1):
        lines.append(f"| {i} | {d:,} | {g:,} |")
    lines.append(f"| **all** | **{sum(direct):,}** | **{sum(gateway):,}** |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.volatile_lines", description=__doc__)
    parser.add_argument("--turns", type=int, default=len(QUESTIONS))
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-volatile-") as tmp:
        direct = run("direct", args.turns, args.seed, Path(tmp))
        gateway = run("gateway", args.turns, args.seed, Path(tmp))
    print("Command: `python -m bench.volatile_lines " + " ".join(sys.argv[1:]) + "`\n")
    print(table(direct, gateway))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
