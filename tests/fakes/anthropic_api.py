"""A fake Anthropic Messages API (``POST /v1/messages``) that behaves like the real one.

- Every body is checked against the official SDK's request types (a pydantic
  ``TypeAdapter`` over ``MessageCreateParams``, each message validated too), and
  top-level keys the API does not know are refused.
- Answers come as a whole ``message`` or as the documented SSE sequence
  (``message_start``, ``ping``, per block ``content_block_start`` / ``_delta`` /
  ``_stop`` with ``thinking_delta`` and ``signature_delta``, ``redacted_thinking``
  whole at its start, ``message_delta`` with cumulative usage, ``message_stop``).
- Anthropic's thinking rules are enforced: a thinking block must be byte-identical
  to one this server issued (400 "Invalid `signature` in `thinking` block"), and
  with thinking on, the assistant turn before the latest tool results must start
  with its thinking (400 "Expected `thinking` or `redacted_thinking`, ...").
- Prompt caching is simulated at the request's ``cache_control`` breakpoints, so
  usage reports ``cache_read_input_tokens`` when a conversation grows.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, get_type_hints

import orjson
from anthropic.types import MessageParam
from anthropic.types.message_create_params import MessageCreateParams, MessageCreateParamsBase
from pydantic import TypeAdapter, ValidationError

from tests.fakes.common import (
    JSON,
    ClientGone,
    HttpRequest,
    Receive,
    Recorder,
    Scope,
    Send,
    StreamWriter,
    cancel_on_disconnect,
    count_tokens,
    fragments,
    random_alnum,
    read_request,
    send_json,
    send_json_cut,
)

_PARAMS = TypeAdapter(MessageCreateParams)
_MESSAGES = TypeAdapter(list[MessageParam])
_KNOWN_KEYS = frozenset(get_type_hints(MessageCreateParamsBase)) | {"stream"}
_SAMPLING_KEYS = frozenset({"temperature", "top_p", "top_k"})

MISSING_THINKING = (
    "messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
    "`{found}`. When `thinking` is enabled, a final `assistant` message must start with a "
    "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). "
    "We recommend you include thinking blocks from previous turns. To avoid this "
    "requirement, disable `thinking`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)
INVALID_SIGNATURE = "messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
FORCED_TOOL = "Thinking may not be enabled when tool_choice forces tool use."
PROMPT_TOO_LONG = "prompt is too long: {n} tokens > {m} maximum"


def error_body(kind: str, message: str) -> JSON:
    """Anthropic's error body."""
    return {
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": "req_" + random_alnum(24),
    }


_DEFAULT_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


class AnthropicError(Exception):
    def __init__(self, status: int, body: JSON, headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = headers or {}


def _invalid(message: str) -> AnthropicError:
    return AnthropicError(400, error_body("invalid_request_error", message))


@dataclass
class AnthropicReply:
    """What the fake model answers to one request, plus fault knobs.

    ``thinking``: the thinking text (used when the request turns thinking on; with
    thinking on and None, a short default is written). ``omit_thinking_text``: the
    block comes with empty text and its signature (display "omitted").
    ``redacted``: a ``redacted_thinking`` block follows the thinking block.
    ``tool_calls``: ``{"name", "input"}`` (an optional ``"id"`` pins the id).
    Faults: ``status`` (+ ``error``: the inner error object, + ``headers``);
    ``break_after_events``: stream that many events and drop the connection (a
    non-streamed body is cut in half); ``error_event_after_events`` (+ ``error``):
    then an ``error`` event and the end of the response.
    """

    text: str = "ok"
    thinking: str | None = None
    omit_thinking_text: bool = False
    redacted: bool = False
    tool_calls: list[dict[str, Any]] | None = None
    stop_reason: str | None = None
    status: int | None = None
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    break_after_events: int | None = None
    error_event_after_events: int | None = None


def message_events(message: JSON, split: Iterable[int] | None = None) -> list[tuple[str, JSON]]:
    """The documented SSE sequence for a whole ``message``.

    ``split`` gives the fragment sizes (tokens per delta) in turn for each text,
    thinking and tool-input delta; None streams one token per delta.
    """
    sizes = iter(split) if split is not None else None

    def pieces(text: str) -> list[str]:
        step = next(sizes, 1) if sizes is not None else 1
        return fragments(text, step) or [""]

    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**usage, "output_tokens": 1}
    events: list[tuple[str, JSON]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        begin: JSON
        deltas: list[JSON] = []
        if kind == "text":
            begin = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
        elif kind == "thinking":
            begin = {"type": "thinking", "thinking": "", "signature": ""}
            if block["thinking"]:
                deltas = [
                    {"type": "thinking_delta", "thinking": p} for p in pieces(block["thinking"])
                ]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "redacted_thinking":
            begin = block
        else:
            begin = {**block, "input": {}}
            raw = orjson.dumps(block["input"]).decode()
            deltas = [{"type": "input_json_delta", "partial_json": ""}]
            deltas += [{"type": "input_json_delta", "partial_json": p} for p in pieces(raw)]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": begin},
            )
        )
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": usage,
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def encode_event(name: str, data: JSON) -> bytes:
    """One named SSE event."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _canonical(block: Any) -> bytes:
    if isinstance(block, dict):
        block = {k: v for k, v in block.items() if k != "cache_control"}
    return orjson.dumps(block, option=orjson.OPT_SORT_KEYS)


class FakeAnthropic:
    """A scripted Messages API on one ASGI app."""

    def __init__(
        self,
        api_key: str,
        context_window: int = 200_000,
        reject_schema: bool = False,
        tokens_per_delta: int = 1,
        sampling_params: bool = True,
    ) -> None:
        self.api_key = api_key
        self.context_window = context_window
        self.reject_schema = reject_schema
        self.tokens_per_delta = tokens_per_delta
        # False: the newer API, whose request types have no temperature, top_p or top_k
        self.sampling_params = sampling_params
        self.requests = Recorder()
        self._replies: list[AnthropicReply] = []
        # signature → thinking text, and redacted data, this server issued
        self.issued: dict[str, str] = {}
        self.issued_redacted: set[str] = set()
        # prefix hash at a cache breakpoint → its tokens
        self._cache: dict[str, int] = {}

    def queue(self, *replies: AnthropicReply) -> None:
        """Answer the next requests with these replies, in order."""
        self._replies.extend(replies)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                pass
            return
        req = await read_request(scope, receive)
        self.requests.append(req.record())
        try:
            if req.method != "POST" or req.path != "/v1/messages":
                raise AnthropicError(404, error_body("not_found_error", "Not found"))
            self._check_headers(req)
            body = self._validate(req)
            reply = self._replies.pop(0) if self._replies else AnthropicReply()
            if reply.status is not None:
                kind = _DEFAULT_ERRORS.get(reply.status, "api_error")
                inner = reply.error or {
                    "type": kind,
                    "message": "Overloaded" if reply.status == 529 else kind,
                }
                raise AnthropicError(
                    reply.status, {**error_body(kind, ""), "error": inner}, reply.headers
                )
            message = self._answer(body, reply)
        except AnthropicError as exc:
            await send_json(send, exc.status, exc.body, {"request-id": "req_x", **exc.headers})
            return
        headers = {"request-id": "req_" + random_alnum(12), **reply.headers}
        if body.get("stream") is True:
            guarded, watcher = cancel_on_disconnect(receive, send)
            try:
                await self._stream(guarded, message, reply, headers)
            except ClientGone:
                pass
            finally:
                watcher.cancel()
        elif reply.break_after_events is not None:
            await send_json_cut(send, message, headers)
        else:
            await send_json(send, 200, message, headers)

    # -- checks

    def _check_headers(self, req: HttpRequest) -> None:
        if req.headers.get("x-api-key") != self.api_key:
            raise AnthropicError(401, error_body("authentication_error", "invalid x-api-key"))
        if req.headers.get("anthropic-version") != "2023-06-01":
            raise _invalid("anthropic-version: header is required")

    def _validate(self, req: HttpRequest) -> JSON:
        body = req.try_json()
        if not isinstance(body, dict):
            raise _invalid("The request body is not valid JSON.")
        known = _KNOWN_KEYS if self.sampling_params else _KNOWN_KEYS - _SAMPLING_KEYS
        unknown = sorted(set(body) - known)
        if unknown:
            raise _invalid(f"{unknown[0]}: Extra inputs are not permitted")
        try:
            _PARAMS.validate_python(body)
            _MESSAGES.validate_python(body["messages"])
        except ValidationError as exc:
            raise _invalid(str(exc).splitlines()[0] + ": " + str(exc.errors()[0]["msg"])) from None
        self._check_turns(body)
        if self.reject_schema and "format" in (body.get("output_config") or {}):
            raise _invalid("output_config.format: structured outputs are not supported")
        return body

    def _thinking_on(self, body: JSON) -> bool:
        return (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")

    def _check_turns(self, body: JSON) -> None:
        messages = body["messages"]
        if not messages or messages[0]["role"] != "user":
            raise _invalid("messages: the first message must use the user role")
        for i, msg in enumerate(messages):
            content = msg["content"]
            if isinstance(content, list) and not content:
                raise _invalid(f"messages.{i}: all messages must have non-empty content")
            for j, block in enumerate(content if isinstance(content, list) else ()):
                self._check_thinking_block(i, j, block)
        thinking = body.get("thinking") or {}
        if thinking.get("type") == "enabled" and thinking["budget_tokens"] >= body["max_tokens"]:
            raise _invalid("`max_tokens` must be greater than `thinking.budget_tokens`.")
        if not self._thinking_on(body):
            return
        if (body.get("tool_choice") or {}).get("type") in ("any", "tool"):
            raise _invalid(FORCED_TOOL)
        if "temperature" in body and body["temperature"] != 1:
            raise _invalid("`temperature` may only be set to 1 when thinking is enabled.")
        self._check_final_assistant(messages)

    def _check_thinking_block(self, i: int, j: int, block: Any) -> None:
        if not isinstance(block, dict):
            return
        if block.get("type") == "thinking":
            if self.issued.get(block.get("signature", "")) != block.get("thinking"):
                raise _invalid(INVALID_SIGNATURE.format(i=i, j=j))
        elif (
            block.get("type") == "redacted_thinking"
            and block.get("data") not in self.issued_redacted
        ):
            raise _invalid(f"messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block")

    def _check_final_assistant(self, messages: list[JSON]) -> None:
        last = messages[-1]
        content = last["content"]
        in_tool_loop = isinstance(content, list) and any(
            b.get("type") == "tool_result" for b in content
        )
        if not in_tool_loop or len(messages) < 2:
            return
        i = len(messages) - 2
        blocks = messages[i]["content"]
        first = blocks[0] if isinstance(blocks, list) and blocks else {"type": "text"}
        if first.get("type") not in ("thinking", "redacted_thinking"):
            raise _invalid(MISSING_THINKING.format(i=i, found=first.get("type")))

    # -- the answer

    def _prompt_blocks(self, body: JSON) -> list[Any]:
        blocks: list[Any] = list(body.get("tools") or [])
        system = body.get("system")
        blocks += system if isinstance(system, list) else ([system] if system else [])
        for msg in body["messages"]:
            content = msg["content"]
            for block in content if isinstance(content, list) else [content]:
                blocks.append([msg["role"], block])
        return blocks

    def _usage(self, body: JSON) -> JSON:
        blocks = self._prompt_blocks(body)
        counts = [count_tokens(_canonical(b).decode()) for b in blocks]
        total = sum(counts)
        if total > self.context_window:
            raise _invalid(PROMPT_TOO_LONG.format(n=total, m=self.context_window))
        digest = hashlib.sha256()
        running = 0
        read = 0
        breakpoints: list[tuple[str, int]] = []
        for block, n in zip(blocks, counts, strict=True):
            digest.update(_canonical(block))
            running += n
            key = digest.copy().hexdigest()
            if key in self._cache:
                read = running
            inner = block[1] if isinstance(block, list) else block
            if isinstance(inner, dict) and "cache_control" in inner:
                breakpoints.append((key, running))
        written = 0
        for key, upto in breakpoints:
            if key not in self._cache:
                self._cache[key] = upto
                written = max(written, upto - read)
        return {
            "input_tokens": total - read - written,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
        }

    def _answer(self, body: JSON, reply: AnthropicReply) -> JSON:
        usage = self._usage(body)
        content: list[JSON] = []
        if self._thinking_on(body):
            text = reply.thinking if reply.thinking is not None else "Let me think."
            signature = secrets.token_urlsafe(48)
            self.issued[signature] = "" if reply.omit_thinking_text else text
            content.append(
                {"type": "thinking", "thinking": self.issued[signature], "signature": signature}
            )
            if reply.redacted:
                data = secrets.token_urlsafe(64)
                self.issued_redacted.add(data)
                content.append({"type": "redacted_thinking", "data": data})
        if reply.text:
            content.append({"type": "text", "text": reply.text, "citations": None})
        for call in reply.tool_calls or ():
            content.append(
                {
                    "type": "tool_use",
                    "id": call.get("id") or "toolu_" + random_alnum(24),
                    "name": call["name"],
                    "input": call.get("input") or {},
                }
            )
        output = sum(
            count_tokens(
                str(b.get("text") or b.get("thinking") or orjson.dumps(b.get("input")).decode())
            )
            for b in content
        )
        stop = reply.stop_reason or ("tool_use" if reply.tool_calls else "end_turn")
        return {
            "id": "msg_" + random_alnum(24),
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": output},
        }

    async def _stream(
        self, send: Send, message: JSON, reply: AnthropicReply, headers: dict[str, str]
    ) -> None:
        writer = StreamWriter(send)
        await writer.start({**headers, "content-type": "text/event-stream"})
        events = message_events(message, _repeat(self.tokens_per_delta))
        for n, (name, data) in enumerate(events):
            if reply.break_after_events is not None and n >= reply.break_after_events:
                return  # the connection drops: no message_stop
            if reply.error_event_after_events is not None and n >= reply.error_event_after_events:
                inner = reply.error or {"type": "overloaded_error", "message": "Overloaded"}
                await writer.write(encode_event("error", {"type": "error", "error": inner}))
                await writer.end()
                return
            await writer.write(encode_event(name, data))
            await asyncio.sleep(0)
        await writer.end()


def _repeat(n: int) -> Iterable[int]:
    while True:
        yield n
