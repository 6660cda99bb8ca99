"""llama-server's HTTP API, one method per endpoint, with one rule for what goes wrong.

A request that cannot be sent or whose answer breaks off is the HTTP client's
``GatewayError``; an answer other than 200 is ``ServerRefused`` (its status and body);
a 200 whose body is not the JSON the endpoint gives is ``MalformedAnswer``. What each
of those means for a probe, a readiness check, the cache keeper or a count is its
caller's to decide. Every request carries the credentials ``headers`` gives for the
server's root (a managed server's own key, ``LLAMA_API_KEY``), and none changes what
a server would answer to it a second time, so each may be sent again on a fresh
connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from boundedcode_gateway.upstream.http import HttpClient, read_body

# the credentials a request to a server's root carries
Headers = Callable[[str], dict[str, str]]


class ServerRefused(Exception):
    """The server answered with a status other than 200."""

    def __init__(self, path: str, status: int, body: bytes) -> None:
        super().__init__(f"{path} answered {status}")
        self.path = path
        self.status = status
        self.body = body


class MalformedAnswer(ValueError):
    """A 200 whose body is not the JSON the endpoint answers with."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


class LlamaServerAPI:
    """The endpoints of a llama-server the gateway reads and writes."""

    __slots__ = ("_headers", "_http")

    def __init__(self, http: HttpClient, headers: Headers) -> None:
        self._http = http
        self._headers = headers

    async def health(self, root: str) -> None:
        """``GET /health``: returns when the server is up (its model loaded)."""
        await self._send("GET", root, "/health")

    async def props(self, root: str) -> dict[str, Any]:
        """``GET /props``: the server's settings and its chat template's."""
        return _object("/props", await self._json("GET", root, "/props"))

    async def slots(self, root: str) -> Any:
        """``GET /slots``: each slot's state (a list; its prompt and text only while the
        server runs with ``LLAMA_SERVER_SLOTS_DEBUG=1``)."""
        return await self._json("GET", root, "/slots")

    async def apply_template(self, root: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /apply-template``: the prompt the chat template renders ``body`` to."""
        return await self._post_object(root, "/apply-template", body)

    async def tokenize(self, root: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /tokenize``: the tokens of ``body["content"]``."""
        return await self._post_object(root, "/tokenize", body)

    async def completion(self, root: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /completion``: a raw prompt evaluated (and continued, unless
        ``n_predict`` is 0)."""
        return await self._post_object(root, "/completion", body)

    async def erase_slot(self, root: str, index: int) -> None:
        """``POST /slots/{index}?action=erase``: the slot's tokens and checkpoints gone."""
        await self._send("POST", root, f"/slots/{index}?action=erase", b"")

    async def save_slot(self, root: str, index: int, filename: str) -> dict[str, Any]:
        """``POST /slots/{index}?action=save``: the slot's tokens and their KV state
        written to ``filename`` in the server's ``--slot-save-path`` (its ``n_saved``
        tokens, ``n_written`` bytes)."""
        return await self._slot_action(root, index, "save", filename)

    async def restore_slot(self, root: str, index: int, filename: str) -> dict[str, Any]:
        """``POST /slots/{index}?action=restore``: the slot loaded from ``filename`` in the
        server's ``--slot-save-path`` (its ``n_restored`` tokens, ``n_read`` bytes)."""
        return await self._slot_action(root, index, "restore", filename)

    async def _slot_action(
        self, root: str, index: int, action: str, filename: str
    ) -> dict[str, Any]:
        path = f"/slots/{index}?action={action}"
        return _object(
            path, await self._json("POST", root, path, orjson.dumps({"filename": filename}))
        )

    async def _post_object(self, root: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return _object(path, await self._json("POST", root, path, orjson.dumps(body)))

    async def _json(self, method: str, root: str, path: str, body: bytes | None = None) -> Any:
        raw = await self._send(method, root, path, body)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise MalformedAnswer(path, f"{path} answered no JSON: {exc}") from None

    async def _send(self, method: str, root: str, path: str, body: bytes | None = None) -> bytes:
        headers = self._headers(root)
        if body:
            headers = {"Content-Type": "application/json", **headers}
        resp = await self._http.send(method, root + path, headers, body, resend_safe=True)
        raw = await read_body(resp)
        if resp.status != 200:
            raise ServerRefused(path, resp.status, raw)
        return raw


def _object(path: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedAnswer(path, f"{path} answered something other than an object")
    return value
