"""The bytes of the benchmark: request bodies the load generator sends, answers the fake returns.

Everything is built once at import, so neither the fake nor the load generator
spends time on JSON while it is being measured.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

MODEL = "m"  # the model name every target is configured with
CLAUDE = "claude"  # the profile name of the translation lane
STREAM_CHUNKS = 200
AGENT_BODY_BYTES = 50_000
AGENT_MESSAGES = 60

_CREATED = 1_700_000_000


def small_body(model: str, stream: bool = False) -> bytes:
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 16,
    }
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


def agent_body(model: str) -> bytes:
    """About 50 KB: an agent's history of 60 messages, mostly tool calls and their results.

    The shape an agent runtime sends on every turn: system prompt, then
    assistant tool calls each followed by a tool result of file contents.
    """
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools to edit the repo."},
        {"role": "user", "content": "Fix the failing test in tests/test_parser.py."},
    ]
    turn = 0
    while len(messages) < AGENT_MESSAGES:
        call_id = f"call_{turn:04d}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": orjson.dumps({"path": f"src/mod_{turn}.py"}).decode(),
                        },
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": ""})
        turn += 1
    tool_messages = [m for m in messages if m["role"] == "tool"]
    # pad the tool results so the whole body lands near AGENT_BODY_BYTES
    skeleton = len(orjson.dumps({"model": model, "messages": messages}))
    per_result = max(0, (AGENT_BODY_BYTES - skeleton) // len(tool_messages))
    for i, m in enumerate(tool_messages):
        line = f"def function_{i}(x):\n    return x + {i}\n"
        m["content"] = (line * (per_result // len(line) + 1))[:per_result]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ]
    return orjson.dumps({"model": model, "messages": messages, "tools": tools, "max_tokens": 64})


# -- OpenAI-shaped answers


def openai_json() -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": _CREATED,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hello from the fake upstream."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18},
        }
    )


def _openai_chunk(delta: dict[str, str], finish: str | None) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": _CREATED,
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def openai_sse_events() -> list[bytes]:
    """200 content chunks with distinct text (LiteLLM aborts a stream of ~100 identical
    chunks), a finish chunk and ``[DONE]``; each one SSE event."""
    events = [
        b"data: " + _openai_chunk({"role": "assistant", "content": " w0"}, None) + b"\n\n",
    ]
    for i in range(1, STREAM_CHUNKS):
        events.append(b"data: " + _openai_chunk({"content": f" w{i}"}, None) + b"\n\n")
    events.append(b"data: " + _openai_chunk({}, "stop") + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


# -- Anthropic-shaped answers


def anthropic_json() -> bytes:
    return orjson.dumps(
        {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": [{"type": "text", "text": "Hello from the fake upstream."}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 6},
        }
    )


def _anthropic_event(name: str, payload: Mapping[str, object]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def anthropic_sse_events() -> list[bytes]:
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 1},
        },
    }
    events = [
        _anthropic_event("message_start", start),
        _anthropic_event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
    ]
    for i in range(STREAM_CHUNKS):
        delta = {"type": "text_delta", "text": f" w{i}"}
        events.append(
            _anthropic_event(
                "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
            )
        )
    events.append(
        _anthropic_event("content_block_stop", {"type": "content_block_stop", "index": 0})
    )
    events.append(
        _anthropic_event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": STREAM_CHUNKS},
            },
        )
    )
    events.append(_anthropic_event("message_stop", {"type": "message_stop"}))
    return events


def anthropic_body(model: str, stream: bool = False) -> bytes:
    """What a caller sends straight to Anthropic's Messages API (the direct lane)."""
    body: dict[str, object] = {
        "model": model,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Say hello."}],
    }
    if stream:
        body["stream"] = True
    return orjson.dumps(body)
