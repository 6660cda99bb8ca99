"""A fake Anthropic Messages API (``POST /v1/messages``) that behaves like the real one.

- The key comes in ``x-api-key`` or, as the SDK's 2.x releases send it,
  ``Authorization: Bearer`` (``x-api-key`` wins when both come).
- ``anthropic-version`` is required, and each version's rules apply: ``2023-06-01``
  takes ``temperature``, ``top_p`` and ``top_k`` (checked here by hand, since the SDK's
  2.x types no longer list them); ``2026-10-21`` refuses them even at their defaults,
  refuses a ``document`` block in an assistant turn and ``citations`` on a user's text.
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
- Answers and faults come from the shared ``Reply`` script (``content`` the text,
  ``reasoning_content`` the thinking, ``tool_calls`` ``{"name", "arguments"}``,
  ``finish_reason`` a stop reason); an error event is Anthropic's ``event: error``.
  ``AnthropicReply`` adds what only Anthropic answers have.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, get_type_hints

import orjson
from anthropic.types import MessageParam
from anthropic.types.message_create_params import MessageCreateParams, MessageCreateParamsBase
from pydantic import TypeAdapter, ValidationError

from tests.fakes.common import (
    JSON,
    CallerLink,
    ClientGone,
    HttpRequest,
    Receive,
    Recorder,
    Reply,
    Scope,
    Send,
    count_tokens,
    fragments,
    play_stream,
    play_whole,
    random_alnum,
    read_request,
    send_json,
    wait_to_answer,
)

_PARAMS = TypeAdapter(MessageCreateParams)
_MESSAGES = TypeAdapter(list[MessageParam])
_SAMPLING_KEYS = frozenset({"temperature", "top_p", "top_k"})
# whichever SDK is installed (its 2.x types have no sampling keys, its 0.x ones have them)
_KNOWN_KEYS = (frozenset(get_type_hints(MessageCreateParamsBase)) | {"stream"}) - _SAMPLING_KEYS
OLD_VERSION = "2023-06-01"
NEW_VERSION = "2026-10-21"
# the versions served here; the real API may still serve 2023-01-01 to its older users
VERSIONS = frozenset({OLD_VERSION, NEW_VERSION})

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
# Anthropic's words for an unknown version and, under 2026-10-21, for a removed field (as
# users quote them); for a model that refuses sampling under 2023-06-01 (Opus 4.7 on)
BAD_VERSION = 'anthropic-version: "{v}" is not a valid version'
EXTRA_INPUT = "{key}: Extra inputs are not permitted"
SAMPLING_DEPRECATED = "`{key}` is deprecated for this model."
# 2026-10-21's content rules; no quoted wording was found, so these are worded the way
# Anthropic words its other content errors (the block's path, then the rule)
ASSISTANT_DOCUMENT = (
    "messages.{i}.content.{j}: `document` blocks are not allowed in `assistant` messages"
)
USER_CITATIONS = (
    "messages.{i}.content.{j}.citations: `citations` may only be empty on `text` blocks "
    "in `user` messages"
)


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
class AnthropicReply(Reply):
    """The shared script (`Reply`) plus what only Anthropic's answers have.

    ``omit_thinking_text``: the thinking block comes with empty text and its signature
    (display "omitted"). ``redacted``: a ``redacted_thinking`` block follows the thinking
    block.
    """

    omit_thinking_text: bool = False
    redacted: bool = False


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
        # False: a model that refuses temperature, top_p and top_k under 2023-06-01 too
        self.sampling_params = sampling_params
        self.requests = Recorder()
        self.replies: deque[Reply] = deque()
        # signature → thinking text, and redacted data, this server issued
        self.issued: dict[str, str] = {}
        self.issued_redacted: set[str] = set()
        # prefix hash at a cache breakpoint → its tokens
        self._cache: dict[str, int] = {}

    def queue(self, *replies: Reply) -> None:
        """Answer the next requests with these replies, in order."""
        self.replies.extend(replies)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                pass
            return
        req = await read_request(scope, receive)
        self.requests.append(req.record())
        link = CallerLink(receive, send)
        try:
            await self._messages(req, link)
        except AnthropicError as exc:
            headers = {"request-id": "req_x", **exc.headers}
            await send_json(link.send, exc.status, exc.body, headers)
        except ClientGone:
            pass
        finally:
            link.close()

    async def _messages(self, req: HttpRequest, link: CallerLink) -> None:
        if req.method != "POST" or req.path != "/v1/messages":
            raise AnthropicError(404, error_body("not_found_error", "Not found"))
        version = self._check_headers(req)
        body = self._validate(req, version)
        reply = self.replies.popleft() if self.replies else Reply()
        if not await wait_to_answer(link, reply):
            return
        if reply.status is not None:
            error = reply.error_body or _error_for(reply.status)
            raise AnthropicError(reply.status, error, reply.headers)
        message = self._answer(body, reply)
        headers = {"request-id": "req_" + random_alnum(12), **reply.headers}
        if body.get("stream") is True:
            await self._stream(link, message, reply, headers)
        else:
            await play_whole(link, 200, message, headers, reply)

    # -- checks

    def _check_headers(self, req: HttpRequest) -> str:
        """The request's API version, once its key is right."""
        key = req.headers.get("x-api-key")
        if key is None:
            key = req.headers.get("authorization", "").removeprefix("Bearer ")
        if key != self.api_key:
            raise AnthropicError(401, error_body("authentication_error", "invalid x-api-key"))
        version = req.headers.get("anthropic-version")
        if version is None:
            raise _invalid("anthropic-version: header is required")
        if version not in VERSIONS:
            raise _invalid(BAD_VERSION.format(v=version))
        return version

    def _validate(self, req: HttpRequest, version: str) -> JSON:
        body = req.try_json()
        if not isinstance(body, dict):
            raise _invalid("The request body is not valid JSON.")
        known = _KNOWN_KEYS | (_SAMPLING_KEYS if version == OLD_VERSION else set())
        unknown = sorted(set(body) - known, key=list(body).index)
        if unknown:
            raise _invalid(EXTRA_INPUT.format(key=unknown[0]))
        _check_sampling(body)
        if not self.sampling_params and (refused := sorted(_SAMPLING_KEYS & set(body))):
            raise _invalid(SAMPLING_DEPRECATED.format(key=refused[0]))
        typed = {k: v for k, v in body.items() if k not in _SAMPLING_KEYS}
        try:
            _PARAMS.validate_python(typed)
            _MESSAGES.validate_python(body["messages"])
        except ValidationError as exc:
            raise _invalid(str(exc).splitlines()[0] + ": " + str(exc.errors()[0]["msg"])) from None
        if version == NEW_VERSION:
            _check_new_content(body["messages"])
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

    def _answer(self, body: JSON, reply: Reply) -> JSON:
        usage = self._usage(body)
        content: list[JSON] = []
        extras = reply if isinstance(reply, AnthropicReply) else AnthropicReply()
        if self._thinking_on(body):
            thinking = reply.reasoning_content
            text = thinking if thinking is not None else "Let me think."
            signature = secrets.token_urlsafe(48)
            self.issued[signature] = "" if extras.omit_thinking_text else text
            content.append(
                {"type": "thinking", "thinking": self.issued[signature], "signature": signature}
            )
            if extras.redacted:
                data = secrets.token_urlsafe(64)
                self.issued_redacted.add(data)
                content.append({"type": "redacted_thinking", "data": data})
        if reply.content:
            content.append({"type": "text", "text": reply.content, "citations": None})
        for call in reply.tool_calls or ():
            content.append(
                {
                    "type": "tool_use",
                    "id": call.get("id") or "toolu_" + random_alnum(24),
                    "name": call["name"],
                    "input": _tool_input(call),
                }
            )
        output = sum(
            count_tokens(
                str(b.get("text") or b.get("thinking") or orjson.dumps(b.get("input")).decode())
            )
            for b in content
        )
        stop = reply.finish_reason or ("tool_use" if reply.tool_calls else "end_turn")
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
        self, link: CallerLink, message: JSON, reply: Reply, headers: dict[str, str]
    ) -> None:
        events = message_events(message, _repeat(self.tokens_per_delta))
        chunks = [encode_event(name, data) for name, data in events]
        inner = reply.error_event or _error_for(reply.error_event_status or 529)["error"]
        error = encode_event("error", {"type": "error", "error": inner})
        # a break drops the connection before message_stop; the stream has no terminator
        await play_stream(
            link, {**headers, "content-type": "text/event-stream"}, chunks, reply, error_event=error
        )


def _check_sampling(body: JSON) -> None:
    """2023-06-01's sampling parameters, by hand: the SDK's 2.x types no longer have them."""
    for key in ("temperature", "top_p"):
        if key not in body:
            continue
        value = body[key]
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _invalid(f"{key}: Input should be a valid number")
        if value > 1:
            raise _invalid(f"{key}: Input should be less than or equal to 1")
        if value < 0:
            raise _invalid(f"{key}: Input should be greater than or equal to 0")
    top_k = body.get("top_k")
    if "top_k" in body and (not isinstance(top_k, int) or isinstance(top_k, bool)):
        raise _invalid("top_k: Input should be a valid integer")
    if isinstance(top_k, int) and top_k < 0:
        raise _invalid("top_k: Input should be greater than or equal to 0")


def _citing(block: Any) -> bool:
    """A text block with non-empty citations, directly or inside a search result."""
    if not isinstance(block, dict):
        return False
    if block.get("type") == "text":
        return bool(block.get("citations"))
    if block.get("type") == "search_result":
        return any(_citing(inner) for inner in block.get("content") or ())
    return False


def _check_new_content(messages: list[JSON]) -> None:
    """What 2026-10-21 refuses in the turns' content."""
    for i, msg in enumerate(messages):
        content = msg["content"]
        for j, block in enumerate(content if isinstance(content, list) else ()):
            if msg["role"] == "assistant" and block.get("type") == "document":
                raise _invalid(ASSISTANT_DOCUMENT.format(i=i, j=j))
            if msg["role"] == "user" and _citing(block):
                raise _invalid(USER_CITATIONS.format(i=i, j=j))


def _error_for(status: int) -> JSON:
    """Anthropic's error body for a status (its default wording)."""
    kind = _DEFAULT_ERRORS.get(status, "api_error")
    return error_body(kind, "Overloaded" if status == 529 else kind)


def _tool_input(call: dict[str, Any]) -> Any:
    """A scripted call's input: its ``arguments`` (an object or JSON text) or ``input``."""
    args = call.get("arguments", call.get("input"))
    if isinstance(args, str):
        return orjson.loads(args) if args else {}
    return args or {}


def _repeat(n: int) -> Iterable[int]:
    while True:
        yield n
