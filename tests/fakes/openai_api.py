"""A fake OpenAI Chat Completions API (and OpenAI-compatible clouds) as a raw ASGI app.

Owns the wire behaviour of OpenAI's API reference: Bearer auth with OpenAI's 401 body
(key masked), unknown model 404, unknown top-level parameter 400, context overflow 400
(`context_length_exceeded`), `usage` with OpenAI's details objects and a prefix prompt
cache (≥ 1024 tokens, multiples of 128), streaming with `usage: null` on every chunk and a
final usage chunk when `stream_options.include_usage` is set.

Reasoning is never returned as text (only counted in `reasoning_tokens`) unless
`returns_reasoning_content` is set, which makes it behave like DeepSeek-style services.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

from tests.fakes.common import (
    JSON,
    SSE_DONE,
    CallerLink,
    ClientGone,
    Generated,
    HttpRequest,
    Receive,
    Recorder,
    Reply,
    Scope,
    Segment,
    Send,
    common_prefix_len,
    content_text,
    default_reply,
    error_event_payload,
    fragments,
    generate,
    play_stream,
    play_whole,
    random_alnum,
    read_request,
    reply_tool_calls,
    send_json,
    sse_event,
    tokenize,
    wait_to_answer,
)

SYSTEM_FINGERPRINT = "fp_fake0001"
KNOWN_PARAMS = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        "n",
        "stop",
        "max_tokens",
        "max_completion_tokens",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "seed",
        "reasoning_effort",
        "service_tier",
        "store",
        "metadata",
        "modalities",
        "prediction",
        "audio",
        "verbosity",
        "web_search_options",
        "prompt_cache_key",
        "safety_identifier",
    }
)
_MIN_CACHED = 1024
_CACHE_STEP = 128
_MAX_REMEMBERED_PROMPTS = 64
_NO_KEY_MESSAGE = (
    "You didn't provide an API key. You need to provide your API key in an Authorization "
    "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field "
    "(with blank username) if you're accessing the API from your browser and are prompted for "
    "a username. You can obtain an API key from https://platform.openai.com/account/api-keys."
)
_DEFAULT_ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request.", "invalid_request_error", None),
    401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    403: ("You are not allowed to access this resource.", "invalid_request_error", None),
    404: ("Not found.", "invalid_request_error", None),
    429: (
        "Rate limit reached for requests. Please try again in 1s. "
        "Visit https://platform.openai.com/account/rate-limits to learn more.",
        "requests",
        "rate_limit_exceeded",
    ),
    500: (
        "The server had an error while processing your request. Sorry about that!",
        "server_error",
        None,
    ),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}


def openai_error_body(
    message: str,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> JSON:
    """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def default_error_body(status: int) -> JSON:
    """The body a scripted error `Reply` gets when it brings none."""
    message, type_, code = _DEFAULT_ERRORS.get(status, ("Upstream error.", "server_error", None))
    return openai_error_body(message, type_, None, code)


def _stream_error(status: int | None) -> JSON:
    """The error object of an in-stream error event: OpenAI's own (a server error, no
    status), or an OpenAI-compatible server's with the status as its code."""
    if status is None:
        return {
            "message": "The server had an error while processing your request. Sorry about that!",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    return {**default_error_body(status)["error"], "code": status}


def mask_key(key: str) -> str:
    """Mask an API key as OpenAI does in its 401 message: first 3, stars, last 4."""
    if len(key) <= 7:
        return "*" * len(key)
    return key[:3] + "*" * (len(key) - 7) + key[-4:]


class OpenAIError(Exception):
    """A request the fake refuses, with status, body and extra headers."""

    def __init__(self, status: int, body: JSON, headers: dict[str, str] | None = None):
        super().__init__(body["error"]["message"])
        self.status = status
        self.body = body
        self.headers = headers or {}


def _invalid(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, openai_error_body(message, "invalid_request_error", param, code))


class FakeOpenAI:
    """Fake OpenAI `POST {path_prefix}/chat/completions` (+ `GET {path_prefix}/models`).

    Knobs are plain attributes and may be changed while the server runs.
    """

    def __init__(
        self,
        *,
        api_key: str = "sk-test-key",
        models: set[str] | None = None,
        context_window: int = 128000,
        path_prefix: str = "/v1",
        reject_unknown_params: bool = True,
        accepts_reasoning_content: bool = True,
        returns_reasoning_content: bool = False,
        requires_reasoning_on_tool_turns: bool = False,
        tokens_per_chunk: int = 1,
    ) -> None:
        self.api_key = api_key
        self.models: set[str] = set(models) if models is not None else {"gpt-5.1"}
        self.context_window = context_window
        self.path_prefix = path_prefix.rstrip("/")
        self.reject_unknown_params = reject_unknown_params
        self.accepts_reasoning_content = accepts_reasoning_content
        self.returns_reasoning_content = returns_reasoning_content
        self.requires_reasoning_on_tool_turns = requires_reasoning_on_tool_turns
        self.tokens_per_chunk = tokens_per_chunk
        self.requests = Recorder()
        self.replies: deque[Reply] = deque()
        self._prompts: dict[str, deque[list[str]]] = {}

    def queue(self, *replies: Reply) -> None:
        """Queue answers for the next chat requests, in order."""
        self.replies.extend(replies)

    def reset_cache(self) -> None:
        """Forget remembered prompts (the prompt cache)."""
        self._prompts.clear()

    # ------------------------------------------------------------------ ASGI entry

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI application."""
        if scope["type"] != "http":
            return
        req = await read_request(scope, receive)
        self.requests.append(req.record())
        link = CallerLink(receive, send)
        try:
            await self._dispatch(req, link)
        except OpenAIError as exc:
            await self._send(link.send, exc.status, exc.body, exc.headers)
        except ClientGone:
            pass
        finally:
            link.close()

    async def _dispatch(self, req: HttpRequest, link: CallerLink) -> None:
        self._check_auth(req)
        if req.method == "POST" and req.path == f"{self.path_prefix}/chat/completions":
            await self._chat(req, link)
        elif req.method == "GET" and req.path == f"{self.path_prefix}/models":
            await self._send(link.send, 200, self._model_list())
        else:
            body = openai_error_body(f"Invalid URL ({req.method} {req.path})")
            raise OpenAIError(404, body)

    def _check_auth(self, req: HttpRequest) -> None:
        auth = req.headers.get("authorization", "")
        if not auth[:7].lower() == "bearer " or not auth[7:].strip():
            raise OpenAIError(401, openai_error_body(_NO_KEY_MESSAGE))
        key = auth[7:].strip()
        if key != self.api_key:
            message = (
                f"Incorrect API key provided: {mask_key(key)}. You can find your API key at "
                "https://platform.openai.com/account/api-keys."
            )
            raise OpenAIError(401, openai_error_body(message, code="invalid_api_key"))

    @staticmethod
    def _base_headers() -> dict[str, str]:
        return {"content-type": "application/json", "x-request-id": "req_" + random_alnum(24)}

    async def _send(
        self, send: Send, status: int, obj: Any, headers: dict[str, str] | None = None
    ) -> None:
        await send_json(send, status, obj, {**self._base_headers(), **(headers or {})})

    def _model_list(self) -> JSON:
        data = [
            {"id": m, "object": "model", "created": 1700000000, "owned_by": "system"}
            for m in sorted(self.models)
        ]
        return {"object": "list", "data": data}

    # ------------------------------------------------------------------ chat

    async def _chat(self, req: HttpRequest, link: CallerLink) -> None:
        body = self._validate(req)
        reply = self.replies.popleft() if self.replies else None
        if reply is not None and reply.status is not None:
            if await wait_to_answer(link, reply):
                error = reply.error_body or default_error_body(reply.status)
                await self._send(link.send, reply.status, error, reply.headers)
            return
        try:
            prompt = self._prompt_tokens(body)
        except OpenAIError:
            if reply is not None:  # a refused request does not use up the scripted answer
                self.replies.appendleft(reply)
            raise
        reply = reply or default_reply(body.get("messages"))
        if not await wait_to_answer(link, reply):
            return
        result = self._generate(body, prompt, reply)
        if body.get("stream") is True:
            await self._stream(reply, result, link)
        else:
            headers = {**self._base_headers(), **reply.headers}
            await play_whole(link, 200, self._response(result), headers, reply)

    def _validate(self, req: HttpRequest) -> JSON:
        try:
            body = req.json()
        except orjson.JSONDecodeError as exc:
            raise _invalid(
                "We could not parse the JSON body of your request. (HINT: This likely means you "
                "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
                "but what was sent was not valid JSON. If you have trouble figuring out how to fix "
                "this, please contact us through our help center at help.openai.com.)"
            ) from exc
        if not isinstance(body, dict):
            raise _invalid("Invalid type for request body: expected an object.")
        self._check_params(body)
        return body

    def _check_params(self, body: JSON) -> None:
        if self.reject_unknown_params:
            for key in body:
                if key not in KNOWN_PARAMS:
                    raise _invalid(f"Unrecognized request argument supplied: {key}")
        model = body.get("model")
        if not model:
            raise _invalid("you must provide a model parameter")
        if model not in self.models:
            message = f"The model `{model}` does not exist or you do not have access to it."
            raise OpenAIError(
                404, openai_error_body(message, "invalid_request_error", None, "model_not_found")
            )
        if "messages" not in body:
            raise _invalid(
                "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"
            )
        if body.get("stream_options") is not None and body.get("stream") is not True:
            raise _invalid(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "stream_options",
            )
        self._check_reasoning_fields(body["messages"])

    def _check_reasoning_fields(self, messages: Any) -> None:
        if not isinstance(messages, list):
            raise _invalid("Invalid type for 'messages': expected an array.", "messages")
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict):
                continue
            if "reasoning_content" in msg and not self.accepts_reasoning_content:
                raise _invalid(
                    f"Additional properties are not allowed ('reasoning_content' was unexpected)"
                    f" - 'messages.{i}'"
                )
            needs = self.requires_reasoning_on_tool_turns and msg.get("tool_calls")
            if needs and msg.get("reasoning_content") is None:
                raise _invalid(
                    "The `reasoning_content` in the thinking mode must be passed back to the API.",
                    code="invalid_request_error",
                )

    def _prompt_tokens(self, body: JSON) -> list[str]:
        tokens = tokenize(_render_prompt(body["messages"], body.get("tools")))
        limit = _first_int(body, "max_completion_tokens", "max_tokens")
        window = self.context_window
        if limit is not None and len(tokens) + limit > window:
            raise _invalid(
                f"This model's maximum context length is {window} tokens. However, you requested "
                f"{len(tokens) + limit} tokens ({len(tokens)} in the messages, {limit} in the "
                "completion). Please reduce the length of the messages or completion.",
                "messages",
                "context_length_exceeded",
            )
        if len(tokens) > window:
            raise _invalid(
                f"This model's maximum context length is {window} tokens. However, your messages "
                f"resulted in {len(tokens)} tokens. Please reduce the length of the messages.",
                "messages",
                "context_length_exceeded",
            )
        return tokens

    def _cached_tokens(self, model: str, prompt: list[str]) -> int:
        remembered = self._prompts.setdefault(model, deque(maxlen=_MAX_REMEMBERED_PROMPTS))
        best = max((common_prefix_len(p, prompt) for p in remembered), default=0)
        remembered.append(prompt)
        if best < _MIN_CACHED:
            return 0
        return best // _CACHE_STEP * _CACHE_STEP

    def _generate(self, body: JSON, prompt: list[str], reply: Reply) -> _Result:
        calls = reply_tool_calls(reply)
        segments = [
            Segment("reasoning", reply.reasoning_content or ""),
            Segment("content", reply.content),
        ]
        segments += [Segment("tool", c.name + c.arguments, i) for i, c in enumerate(calls)]
        limit = _first_int(body, "max_completion_tokens", "max_tokens")
        gen = generate(segments, calls, reply, limit)
        model = str(body["model"])
        return _Result(
            id="chatcmpl-" + random_alnum(29),
            created=int(time.time()),
            model=model,
            prompt_tokens=len(prompt),
            cached_tokens=self._cached_tokens(model, prompt),
            gen=gen,
            include_usage=_include_usage(body),
        )

    # ------------------------------------------------------------------ responses

    def _message(self, gen: Generated) -> JSON:
        message: JSON = {
            "role": "assistant",
            "content": gen.content if gen.content or not gen.tool_calls else None,
        }
        if self.returns_reasoning_content and gen.reasoning:
            message["reasoning_content"] = gen.reasoning
        if gen.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in gen.tool_calls
            ]
        message["refusal"] = None
        message["annotations"] = []
        return message

    def _response(self, result: _Result) -> JSON:
        choice = {
            "index": 0,
            "message": self._message(result.gen),
            "logprobs": None,
            "finish_reason": result.gen.finish_reason,
        }
        return {
            "id": result.id,
            "object": "chat.completion",
            "created": result.created,
            "model": result.model,
            "choices": [choice],
            "usage": result.usage(),
            "service_tier": "default",
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }

    def _chunk(self, result: _Result, choices: list[JSON]) -> JSON:
        chunk: JSON = {
            "id": result.id,
            "object": "chat.completion.chunk",
            "created": result.created,
            "model": result.model,
            "service_tier": "default",
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": choices,
        }
        if result.include_usage:
            chunk["usage"] = None
        return chunk

    def _delta_chunk(self, result: _Result, delta: JSON, finish: str | None = None) -> JSON:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return self._chunk(result, [choice])

    def _deltas(self, gen: Generated) -> list[JSON]:
        per = self.tokens_per_chunk
        deltas: list[JSON] = [{"role": "assistant", "content": "", "refusal": None}]
        if self.returns_reasoning_content:
            deltas += [{"reasoning_content": f} for f in fragments(gen.reasoning, per)]
        deltas += [{"content": f} for f in fragments(gen.content, per)]
        for i, call in enumerate(gen.tool_calls):
            head = {
                "index": i,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            deltas.append({"tool_calls": [head]})
            deltas += [
                {"tool_calls": [{"index": i, "function": {"arguments": f}}]}
                for f in fragments(call.arguments, per)
            ]
        return deltas

    def _stream_chunks(self, result: _Result) -> list[JSON]:
        chunks = [self._delta_chunk(result, d) for d in self._deltas(result.gen)]
        chunks.append(self._delta_chunk(result, {}, result.gen.finish_reason))
        if result.include_usage:
            chunks.append({**self._chunk(result, []), "usage": result.usage()})
        return chunks

    async def _stream(self, reply: Reply, result: _Result, link: CallerLink) -> None:
        headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "x-request-id": "req_" + random_alnum(24),
            **reply.headers,
        }
        chunks = [sse_event(c) for c in self._stream_chunks(result)]
        error = sse_event(error_event_payload(reply, _stream_error(reply.error_event_status)))
        await play_stream(link, headers, chunks, reply, error_event=error, terminator=SSE_DONE)


@dataclass
class _Result:
    """What one completion produced."""

    id: str
    created: int
    model: str
    prompt_tokens: int
    cached_tokens: int
    gen: Generated
    include_usage: bool

    def usage(self) -> JSON:
        """OpenAI's `usage` object, details included."""
        completion = len(self.gen.tokens)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": self.gen.reasoning_tokens,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }


def _include_usage(body: JSON) -> bool:
    opts = body.get("stream_options")
    return isinstance(opts, dict) and opts.get("include_usage") is True


def _render_prompt(messages: Any, tools: Any) -> str:
    """The text OpenAI would tokenize for a request (a rough harmony-like rendering)."""
    out: list[str] = []
    if isinstance(tools, list) and tools:
        out.append("<|start|>developer<|message|># Tools\n")
        out.extend(orjson.dumps(t).decode() + "\n" for t in tools)
        out.append("<|end|>")
    for msg in messages if isinstance(messages, list) else []:
        if not isinstance(msg, dict):
            continue
        calls = "".join(
            orjson.dumps(c.get("function", {})).decode()
            for c in msg.get("tool_calls") or []
            if isinstance(c, dict)
        )
        text = content_text(msg.get("content"))
        out.append(f"<|start|>{msg.get('role')}<|message|>{text}{calls}<|end|>")
    out.append("<|start|>assistant")
    return "".join(out)


def _first_int(body: JSON, *keys: str) -> int | None:
    for key in keys:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
