"""An OpenAI-compatible upstream that answers with exactly the objects a test gives it.

The other fakes behave like their real servers; this one says whatever it is told, so a
test can send the gateway what no well-behaved upstream would (a usage count SQLite cannot
store, a model name of five thousand characters). A streamed call gets the answer as one
chunk, its usage in a last chunk, then ``[DONE]``.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.fakes.common import JSON, Receive, Scope, Send, read_request, send_json
from tests.fakes.server import RunningServer


def canned_answer(
    content: str = "ok",
    model: str = "canned-model",
    finish_reason: str = "stop",
    usage: JSON | None = None,
) -> JSON:
    """A chat completion as OpenAI writes it."""
    return {
        "id": "chatcmpl-canned",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage
        if usage is not None
        else {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


@dataclass
class CannedUpstream:
    """The queued answers (the default one when none is queued) and where it listens."""

    answers: deque[JSON] = field(default_factory=deque)
    requests: list[str] = field(default_factory=list)  # "METHOD /path", in order
    server: RunningServer | None = None

    def profiles(self) -> dict[str, dict[str, Any]]:
        """One model profile, ``canned``, on this upstream (a server the gateway does not run)."""
        assert self.server is not None
        return {"canned": {"provider": "openai-compatible", "base_url": self.server.url + "/v1"}}

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = await read_request(scope, receive)
        self.requests.append(f"{request.method} {request.path}")
        if request.path != "/v1/chat/completions":
            await send_json(send, 404, {"error": {"message": "not found"}}, {})
            return
        answer = self.answers.popleft() if self.answers else canned_answer()
        body = orjson.loads(request.raw_body) if request.raw_body else {}
        if not body.get("stream"):
            await _send(send, "application/json", _encode(answer))
            return
        choice = answer["choices"][0]
        chunks = [
            {
                **{k: v for k, v in answer.items() if k not in ("choices", "usage")},
                "object": "chat.completion.chunk",
                "choices": [
                    {
                        "index": 0,
                        "delta": choice["message"],
                        "finish_reason": choice["finish_reason"],
                    }
                ],
            },
            {
                **{k: v for k, v in answer.items() if k not in ("choices", "usage")},
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": answer.get("usage"),
            },
        ]
        payload = b"".join(b"data: " + _encode(c) + b"\n\n" for c in chunks)
        await _send(send, "text/event-stream", payload + b"data: [DONE]\n\n")


def _encode(obj: JSON) -> bytes:
    # the standard json writes integers of any size (orjson stops at 64 bits)
    return json.dumps(obj).encode()


async def _send(send: Send, content_type: str, body: bytes) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
