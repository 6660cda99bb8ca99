"""The alternative to the repair, measured: send the next prompt as token ids, keeping the
ids the model sampled, so nothing is tokenised anew.

Straight to llama-server, no gateway: each turn's prompt is rendered by the server
(``/apply-template``); the part the previous turn already holds (its prompt and the
sampled answer) goes as the ids it was evaluated and sampled as, only the new tail
is tokenised (``/tokenize``), and ``/completion`` evaluates it with the same
sampling settings. The raw answer is split at ``</think>`` into reasoning and
content, as the Qwen3-style template renders them back; a gateway doing this would
have to parse every model's reasoning and tool-call format itself, which the chat
endpoint does for it today.
"""

from __future__ import annotations

from typing import Any

import httpx

THINK_END = "</think>"


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.post(path, json=body)
    resp.raise_for_status()
    out = resp.json()
    assert isinstance(out, dict)
    return out


def _ids(client: httpx.Client, text: str, special: bool) -> list[int]:
    body = {"content": text, "add_special": special, "parse_special": True}
    return [int(t) for t in _post(client, "/tokenize", body)["tokens"]]


def converse(server: str, questions: list[str], seed: int, budget: dict[str, Any]) -> list[int]:
    """Evaluated prompt tokens per turn when every prompt goes as token ids."""
    history: list[dict[str, Any]] = []
    held_text = ""  # what the server's slot holds, as text: prompt and sampled answer
    held_ids: list[int] = []
    evaluated: list[int] = []
    with httpx.Client(base_url=server, timeout=300) as client:
        for question in questions:
            history.append({"role": "user", "content": question})
            text = _post(client, "/apply-template", {"messages": history})["prompt"]
            if held_ids and text.startswith(held_text):
                ids = held_ids + _ids(client, text[len(held_text) :], special=False)
            else:
                ids = _ids(client, text, special=True)
            answer = _post(
                client,
                "/completion",
                {
                    "prompt": ids,
                    "n_predict": budget["max_tokens"],
                    "temperature": budget["temperature"],
                    "seed": seed,
                    "cache_prompt": True,
                    "return_tokens": True,
                    "reasoning_budget_tokens": budget["reasoning_budget_tokens"],
                    "reasoning_budget_start_tag": "<think>",
                    "reasoning_budget_end_tags": [THINK_END],
                },
            )
            evaluated.append(int(answer["timings"]["prompt_n"]))
            raw = str(answer["content"])
            reasoning, _, content = raw.partition(THINK_END)
            held_ids = ids + [int(t) for t in answer["tokens"]]
            held_text = text + raw
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if _:
                message["reasoning_content"] = reasoning
            history.append(message)
    return evaluated
