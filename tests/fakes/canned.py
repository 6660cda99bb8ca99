"""An OpenAI-compatible upstream that answers with exactly the objects a test gives it.

The other fakes behave like their real servers; this one says whatever it is told, so a
test can send the gateway what no well-behaved upstream would (a usage count SQLite cannot
store, a model name of five thousand characters). A streamed call gets the answer as one
chunk, its usage in a last chunk, then ``[DONE]``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.fakes.common import JSON, Receive, Scope, Send, read_request, send_json, sse_event
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
    server: RunningServer | None = None

    def profiles(self) -> dict[str, dict[str, Any]]:
        """One model profile, ``canned``, on this upstream (a server the gateway does not run)."""
        assert self.server is not None
        return {"canned": {"provider": "openai-compatible", "base_url": self.server.url + "/v1"}}

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = await read_request(scope, receive)
        answer = self.answers.popleft() if self.answers else canned_answer()
        body = orjson.loads(request.raw_body) if request.raw_body else {}
        if not body.get("stream"):
            await send_json(send, 200, answer, {"content-type": "application/json"})
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
        payload = b"".join(sse_event(c) for c in chunks) + b"data: [DONE]\n\n"
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": payload, "more_body": False})
