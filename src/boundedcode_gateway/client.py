"""A typed helper for control-plane callers: one chat call whose reply is a pydantic model.

``structured_call`` builds the JSON schema from the model (fields in declaration
order, which is the order the prompt should describe them in), sends it as
OpenAI's ``response_format``, and returns a validated instance. It talks plain
HTTP to the gateway; it does not import the gateway's server side.

It asks for a whole (non-streamed) answer, which never holds a discard event: a
broken upstream answer is sent again inside the gateway and only the complete
one arrives. It still declares that it understands the event, as the project's
own clients do; a version that streams must then drop what came before a
discard chunk and keep only what follows it.
"""

from __future__ import annotations

import http.client
from collections.abc import Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import orjson
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

# the gateway's discard event (docs/failures.md)
DISCARD_HEADER = "X-BoundedCode-Stream-Discard"


class StructuredOutputError(Exception):
    """The gateway answered, but not with JSON of the requested shape (or not at all)."""

    def __init__(self, message: str, reply: str | None = None) -> None:
        super().__init__(message)
        self.reply = reply


def response_format_for(schema: type[BaseModel]) -> dict[str, Any]:
    """OpenAI's ``response_format`` for a pydantic model, fields in declaration order."""
    return {
        "type": "json_schema",
        "json_schema": {"name": schema.__name__, "schema": schema.model_json_schema()},
    }


def _post(
    base_url: str, path: str, body: dict[str, Any], headers: dict[str, str], timeout_s: float
) -> tuple[int, bytes]:
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(
        parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout_s
    )
    try:
        conn.request(
            "POST",
            parts.path.rstrip("/") + path,
            body=orjson.dumps(body),
            headers={"Content-Type": "application/json", **headers},
        )
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def structured_call(
    base_url: str,
    model: str,
    messages: Sequence[dict[str, Any]],
    schema: type[M],
    purpose: str = "contract",
    task: str | None = None,
    timeout_s: float = 600.0,
    **extra: Any,
) -> M:
    """Ask ``model`` through the gateway at ``base_url`` (``…/v1``) for a ``schema`` instance.

    Raises ``StructuredOutputError`` when the call fails or the reply does not parse.
    """
    headers = {"X-BoundedCode-Purpose": purpose, DISCARD_HEADER: "1"}
    if task:
        headers["X-BoundedCode-Task"] = task
    body = {
        "model": model,
        "messages": list(messages),
        "response_format": response_format_for(schema),
        **extra,
    }
    status, raw = _post(base_url, "/chat/completions", body, headers, timeout_s)
    answer = orjson.loads(raw)
    if status != 200:
        raise StructuredOutputError(
            f"the gateway answered {status}: {answer.get('error', {}).get('message', raw[:200])}"
        )
    text = answer["choices"][0]["message"].get("content")
    try:
        return schema.model_validate_json(text or "")
    except ValidationError as exc:
        raise StructuredOutputError(
            f"the reply is not a valid {schema.__name__}: {exc}", text
        ) from None
