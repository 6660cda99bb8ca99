"""A fake llama.cpp `llama-server` (single-model mode) as a raw ASGI app.

Owns the wire behaviour of the pinned llama-server (held to the real one by
tests/integration/test_fake_parity.py): `/health`, `/props`,
`/v1/models`, `/v1/chat/completions` (and `/chat/completions`), the error catalogue and
bodies, `Server: llama.cpp` and `Connection: close` on every error, streaming order with
`prompt_progress`, `usage` and `timings`, and the per-slot prompt cache.

A final assistant message is continued as the pinned server continues it: the prompt
ends with it (its reasoning after `<think>`, closed when content follows, then its
content), and the model goes on with the rest of the queued reply (the reply's text
after the partial one, when it starts with it, then its tool calls, which the real
server parses from the continued turn like any other's). With `continue_final_message` the
stream holds only the new text; without it the partial text comes again first. A
final message with tool calls is refused, as the real server refuses it.

The "model" is a ChatML-like template plus the `Reply` queue (or, when it is empty, the
`responder`, which answers from the request: tests/agents/scripted_model.py). The cache
rule is the real one: a slot keeps the tokens of its previous prompt plus the tokens it
generated, rendered as the template renders that assistant turn (reasoning included). A
history that sends the reasoning back matches the cache; one that drops it stops matching
at that turn.

It must not sleep to fake timings: `timings` are computed from token counts and the
`*_ms_per_token` knobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
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
    ToolCall,
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
    sleep_ms,
    sse_event,
    tokenize,
    wait_to_answer,
)

BUILD_INFO = "b11434-fake"
# what llama.cpp writes first in a slot's state file ("ggsq" as a little-endian uint32)
SLOT_FILE_MAGIC = b"qsgg"
MEDIA_MARKER = "<__media__>"
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.role == 'assistant' and preserve_thinking %}"
    "{{- '<think>\\n' + (message.reasoning_content or '') + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}
_SUCCESS_HEADERS = {
    "server": "llama.cpp",
    "content-type": "application/json; charset=utf-8",
    "keep-alive": "timeout=5, max=100",
}
_HEALTH_PATHS = frozenset({"/health", "/v1/health"})
_CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
_CACHE_PATHS = frozenset({"/slots", "/apply-template", "/tokenize", "/completion"})
_SLOT_ACTION = re.compile(r"/slots/[0-9]+")
_TOOL_CHOICES = frozenset({"auto", "none", "required"})
_REASONING_FORMATS = frozenset({"none", "auto", "deepseek", "deepseek-legacy"})
# continue_final_message values (as JSON) → the part of the message continued
_CONTINUE_MODES = {b"true": "auto", b'"content"': "content", b'"reasoning_content"': "reasoning"}
# a chat request's body → the answer to give it
Responder = Callable[[JSON], Reply]
_MMPROJ_HINT = (
    "input is not supported - hint: if this is unexpected, you may need to provide the mmproj"
)


def llama_error_body(status: int, message: str, type_: str | None = None, **extra: Any) -> JSON:
    """An error body as llama-server writes it: `{"error": {"code", "message", "type", ...}}`."""
    error: JSON = {
        "code": status,
        "message": message,
        "type": type_ or _TYPE_BY_STATUS.get(status, "server_error"),
    }
    error.update(extra)
    return {"error": error}


class LlamaError(Exception):
    """A request the fake refuses; carries the HTTP status and the exact body."""

    def __init__(self, status: int, message: str, type_: str | None = None, **extra: Any):
        super().__init__(message)
        self.status = status
        self.body = llama_error_body(status, message, type_, **extra)


def render_tool_call(name: str, arguments: Any) -> str:
    """A tool call as the template writes it; arguments are normalised like Jinja's tojson."""
    args = arguments
    if isinstance(arguments, str):
        try:
            args = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            args = arguments
    return "<tool_call>" + orjson.dumps({"name": name, "arguments": args}).decode() + "</tool_call>"


@dataclass
class _ChatTask:
    """A validated chat request, rendered to a prompt."""

    model: str
    stream: bool
    include_usage: bool
    return_progress: bool
    timings_per_token: bool
    cache_prompt: bool
    id_slot: int
    n_predict: int | None
    thinking: bool
    prefill: bool
    prompt: str
    prompt_tokens: list[str]
    # continuing the final assistant message: "content", "reasoning" or ""
    continue_mode: str = ""
    # without continue_final_message the stream repeats the partial text first
    echo_prefill: bool = False
    prefill_content: str = ""
    prefill_reasoning: str = ""


@dataclass
class _Result:
    """What one completion produced: ids, cache arithmetic and the generation."""

    id: str
    created: int
    model: str
    cache_n: int
    prompt_n: int
    n_prompt: int
    gen: Generated
    timings: JSON
    # a continued message: the partial text that the whole answer starts with
    prefix_content: str = ""
    prefix_reasoning: str = ""


class FakeLlamaServer:
    """Fake `llama-server`. Serve `.app` with `serve_in_thread`; queue answers with `.queue()`.

    Knobs are plain attributes and may be changed while the server runs (e.g. `loading`).
    """

    def __init__(
        self,
        *,
        n_ctx: int = 4096,
        total_slots: int = 1,
        props_enabled: bool = True,
        loading: bool = False,
        supports_preserve_reasoning: bool = True,
        supports_tools: bool = True,
        vision: bool = False,
        audio: bool = False,
        video: bool = False,
        api_key: str | None = None,
        prompt_ms_per_token: float = 0.5,
        predicted_ms_per_token: float = 10.0,
        model_alias: str = "fake-model",
        thinking: bool = True,
        progress_batch: int = 64,
        tokens_per_chunk: int = 1,
        slot_prompt_similarity: float = 0.10,
        split_rate: float = 0.0,
        split_seed: int = 0,
        slots_debug: bool = True,
        system_anywhere: bool = True,
    ) -> None:
        self.n_ctx = n_ctx
        self.total_slots = total_slots
        self.props_enabled = props_enabled
        self.loading = loading
        self.supports_preserve_reasoning = supports_preserve_reasoning
        self.supports_tools = supports_tools
        self.vision = vision
        self.audio = audio
        self.video = video
        # each media URL the server downloaded, as the real one downloads a part's source
        # that begins with "http" (server-common.cpp, handle_media)
        self.media_fetches: list[str] = []
        self.api_key = api_key
        self.prompt_ms_per_token = prompt_ms_per_token
        self.predicted_ms_per_token = predicted_ms_per_token
        self.model_alias = model_alias
        # the GGUF file it serves, as /props names it (a slot file records it)
        self.model_path = f"/models/{model_alias}.gguf"
        self.thinking = thinking
        self.progress_batch = progress_batch
        self.tokens_per_chunk = tokens_per_chunk
        self.slot_prompt_similarity = slot_prompt_similarity
        # False: a template that takes one system message, at the start (most llama.cpp
        # templates raise on any other)
        self.system_anywhere = system_anywhere
        # The real model now and then samples a word as two tokens where the tokenizer
        # would make one; the next prompt, tokenised canonically, stops matching there.
        # Each generated word of 4+ characters is split with `split_rate` (seeded), and
        # every word in `split_words` always is.
        self.split_rate = split_rate
        self.split_words: set[str] = set()
        self._split_rng = random.Random(split_seed)
        self.slot_info: list[JSON] = [{} for _ in range(total_slots)]
        # LLAMA_SERVER_SLOTS_DEBUG=1: /slots shows each slot's prompt and generated text
        self.slots_debug = slots_debug
        # a template that writes an empty reasoning block when thinking is off (Qwen3's);
        # False: a model that never reasons (SmolLM2's own template)
        self.empty_think_when_off = True
        # how the template (and so the model) closes a reasoning block
        self.close_reasoning = "\n</think>\n\n"
        # other clients of a shared server: /slots shows every slot processing
        self.busy_elsewhere = False
        # a `/completion` holds its slot this long (a long prompt being evaluated)
        self.completion_delay_ms = 0.0
        self.requests = Recorder()
        self.cache_requests = Recorder()
        # `--slot-save-path` given: slots may be erased (POST /slots/{id}?action=erase)
        self.slot_actions = True
        # the `--slot-save-path` folder slots are saved to and restored from (None: erase
        # only); the files are the fake's own, begun with llama.cpp's state magic
        self.slot_save_path: Path | None = None
        # a model whose restored state the server does not reuse (llama.cpp's hybrid and
        # sliding-window models): a restore answers as usual and the slot keeps nothing
        self.restore_ineffective = False
        self.saved: list[tuple[int, str]] = []  # (slot, file name) of each save, in order
        self.restored: list[tuple[int, str]] = []  # the same of each restore
        self.erased: list[int] = []  # the slots erased, in order
        self.replies: deque[Reply] = deque()
        # answers a chat request when no reply is queued (a scripted model); None: the
        # default reply
        self.responder: Responder | None = None
        self.prompts: list[str] = []
        self.slot_tokens: list[list[str]] = [[] for _ in range(total_slots)]
        self._busy: set[int] = set()
        self._last_used: list[int] = [-1] * total_slots
        self._use_counter = 0
        self._cond: asyncio.Condition | None = None
        self._cond_loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ public helpers

    def queue(self, *replies: Reply) -> None:
        """Queue answers for the next chat requests, in order."""
        self.replies.extend(replies)

    def reset_cache(self) -> None:
        """Forget every slot's cached tokens."""
        self.slot_tokens = [[] for _ in range(self.total_slots)]
        self._last_used = [-1] * self.total_slots
        self.slot_info = [{} for _ in range(self.total_slots)]

    def caps(self) -> dict[str, bool]:
        """`chat_template_caps` as `/props` reports them."""
        return {
            "supports_string_content": True,
            "supports_typed_content": False,
            "supports_tools": self.supports_tools,
            "supports_tool_calls": self.supports_tools,
            "supports_parallel_tool_calls": self.supports_tools,
            "supports_system_role": True,
            "supports_preserve_reasoning": self.supports_preserve_reasoning,
            "supports_reasoning_effort": False,
            "supports_object_arguments": False,
        }

    def props(self) -> JSON:
        """The `/props` body (single-model mode)."""
        return {
            "default_generation_settings": {
                "params": {
                    "seed": 4294967295,
                    "temperature": 0.8,
                    "top_k": 40,
                    "top_p": 0.95,
                    "min_p": 0.05,
                    "repeat_penalty": 1.0,
                    "presence_penalty": 0.0,
                    "frequency_penalty": 0.0,
                    "max_tokens": -1,
                    "n_predict": -1,
                    "reasoning_format": "deepseek",
                    "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
                },
                "n_ctx": self.n_ctx,
            },
            "total_slots": self.total_slots,
            "model_alias": self.model_alias,
            "model_ftype": "Q4_K - Medium",
            "model_path": self.model_path,
            "modalities": {"vision": self.vision, "video": self.video, "audio": self.audio},
            "media_marker": MEDIA_MARKER,
            "endpoint_slots": True,
            "endpoint_props": False,
            "endpoint_metrics": False,
            "ui": True,
            "ui_settings": {},
            "chat_template": CHAT_TEMPLATE,
            "chat_template_caps": self.caps(),
            "bos_token": "",
            "eos_token": "<|im_end|>",
            "build_info": BUILD_INFO,
            "is_sleeping": False,
            "cors_proxy_enabled": False,
        }

    # ------------------------------------------------------------------ ASGI entry

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI application."""
        if scope["type"] != "http":
            return
        req = await read_request(scope, receive)
        # what the gateway's cache keeper asks is kept apart from the callers' traffic
        kept_apart = req.path in _CACHE_PATHS
        (self.cache_requests if kept_apart else self.requests).append(req.record())
        link = CallerLink(receive, send)
        try:
            if kept_apart:
                await self._until_gone(self._dispatch(req, link), link.watcher)
            else:
                await self._dispatch(req, link)
        except LlamaError as exc:
            await self._send(link.send, exc.status, exc.body)
        except ClientGone:
            pass
        finally:
            link.close()

    @staticmethod
    async def _until_gone(work: Awaitable[None], watcher: asyncio.Task[None]) -> None:
        """Run ``work`` until it ends or its client leaves: the real server stops evaluating
        a prompt whose client disconnected (between batches) and frees the slot."""
        task = asyncio.ensure_future(work)
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return
        await task

    async def _dispatch(self, req: HttpRequest, link: CallerLink) -> None:
        # Order of the real pre-routing middleware: loading state, then API key, then routes.
        if self.loading:
            raise LlamaError(503, "Loading model")
        if self.api_key is not None and req.path not in _HEALTH_PATHS and not self._authorized(req):
            raise LlamaError(401, "Invalid API Key")
        if req.method == "POST" and req.path in _CHAT_PATHS:
            await self._chat(req, link)
            return
        handler = self._route(req)
        if handler is None:
            raise LlamaError(404, "File Not Found")
        await handler(req, link.send)

    def _route(self, req: HttpRequest) -> Callable[[HttpRequest, Send], Awaitable[None]] | None:
        if req.method == "GET" and req.path in _HEALTH_PATHS:
            return self._health
        if req.method == "GET" and req.path == "/props" and self.props_enabled:
            return self._props
        if req.method == "GET" and req.path in ("/v1/models", "/models"):
            return self._models
        if req.method == "GET" and req.path == "/slots":
            return self._slots
        if req.method == "POST" and req.path == "/apply-template":
            return self._apply_template
        if req.method == "POST" and req.path == "/tokenize":
            return self._tokenize
        if req.method == "POST" and req.path == "/completion":
            return self._completion
        if req.method == "POST" and _SLOT_ACTION.fullmatch(req.path):
            return self._slot_action
        return None

    def _authorized(self, req: HttpRequest) -> bool:
        auth = req.headers.get("authorization", "")
        bearer = auth[7:] if auth[:7].lower() == "bearer " else None
        return self.api_key in (bearer, req.headers.get("x-api-key"))

    @staticmethod
    async def _send(
        send: Send, status: int, obj: Any, extra_headers: dict[str, str] | None = None
    ) -> None:
        headers = {"server": "llama.cpp", "content-type": "application/json; charset=utf-8"}
        if status >= 400:
            # cpp-httplib closes the connection after every error; uvicorn does the same
            # when the response carries this header.
            headers["connection"] = "close"
        else:
            headers = dict(_SUCCESS_HEADERS)
        headers.update(extra_headers or {})
        await send_json(send, status, obj, headers)

    async def _health(self, req: HttpRequest, send: Send) -> None:
        await self._send(send, 200, {"status": "ok"})

    async def _props(self, req: HttpRequest, send: Send) -> None:
        await self._send(send, 200, self.props())

    async def _models(self, req: HttpRequest, send: Send) -> None:
        model = {
            "id": self.model_alias,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "llamacpp",
            "meta": {"n_ctx_train": self.n_ctx, "n_vocab": 151936},
        }
        await self._send(send, 200, {"object": "list", "data": [model]})

    # ------------------------------------------------------------------ chat

    def _modalities(self) -> _Modalities:
        return _Modalities(self.vision, self.audio, self.video)

    async def _load_media(self, body: JSON) -> None:
        """Each media part's source, as the real server loads it: a URL beginning with
        "http" downloaded (10 s, any 2xx), other sources decoded in place."""
        messages = body.get("messages") if isinstance(body, dict) else None
        for msg in messages if isinstance(messages, list) else []:
            content = msg.get("content") if isinstance(msg, dict) else None
            for part in content if isinstance(content, list) else []:
                _check_part(part, self._modalities())
                url = _media_source(part)
                if url.startswith("http"):
                    await self._download(url)

    async def _download(self, url: str) -> None:
        self.media_fetches.append(url)
        try:
            async with httpx.AsyncClient(timeout=10) as client:
                resp = await client.get(url)
        except httpx.HTTPError as exc:
            raise LlamaError(500, "Failed to download image") from exc
        if not 200 <= resp.status_code < 300:
            raise LlamaError(500, "Failed to download image")

    async def _chat(self, req: HttpRequest, link: CallerLink) -> None:
        body = _parse_body(req)
        await self._load_media(body)
        queued = bool(self.replies)
        reply = self.replies.popleft() if queued else None
        if reply is None and self.responder is not None:
            reply = self.responder(body)
        if reply is not None and reply.status is not None:
            if await wait_to_answer(link, reply):
                error = reply.error_body or llama_error_body(reply.status, "fake upstream error")
                await self._send(link.send, reply.status, error, reply.headers)
            return
        try:
            task = self._prepare(body)
        except LlamaError:
            if queued and reply is not None:  # a refused request keeps the queued answer
                self.replies.appendleft(reply)
            raise
        await self._complete(task, reply or default_reply(body.get("messages")), link)

    async def _complete(self, task: _ChatTask, reply: Reply, link: CallerLink) -> None:
        slot = await self._acquire_slot(task)
        try:
            if not await wait_to_answer(link, reply):
                return
            result = self._evaluate(task, reply, slot)
            if task.stream:
                await self._stream(task, reply, result, link)
            else:
                headers = {**_SUCCESS_HEADERS, **reply.headers}
                await play_whole(link, 200, self._response(result), headers, reply)
        finally:
            await self._release_slot(slot)

    def _prepare(self, body: JSON) -> _ChatTask:
        _check_response_format(body)
        messages = _check_messages(body, self._modalities())
        tools: list[Any] = body["tools"] if isinstance(body.get("tools"), list) else []
        tool_choice = _parse_tool_choice(body)
        _check_reasoning_format(body)
        if tools and tool_choice != "none" and "grammar" in body:
            raise LlamaError(400, "Cannot use custom grammar constraints with tools.")
        kwargs = body.get("chat_template_kwargs")
        kwargs = kwargs if isinstance(kwargs, dict) else {}
        thinking = self.thinking and _enable_thinking(kwargs, body)
        continue_mode, explicit = _continuation(body, messages)
        prefill = continue_mode != ""
        _check_logprobs(body)
        _check_n(body, self.total_slots)
        preserve = (
            self.supports_preserve_reasoning and kwargs.get("preserve_reasoning") is not False
        )
        prompt = self._render(
            messages, tools if self.supports_tools else [], preserve, thinking, continue_mode
        )
        tokens = tokenize(prompt)
        if len(tokens) >= self.n_ctx:
            raise LlamaError(
                400,
                f"request ({len(tokens)} tokens) exceeds the available context size "
                f"({self.n_ctx} tokens), try increasing it",
                "exceed_context_size_error",
                n_prompt_tokens=len(tokens),
                n_ctx=self.n_ctx,
            )
        task = self._task(body, thinking, prefill, prompt, tokens)
        if prefill:
            task.continue_mode = continue_mode
            task.echo_prefill = not explicit
            task.prefill_content = self._content(messages[-1].get("content"))
            task.prefill_reasoning = str(messages[-1].get("reasoning_content") or "")
        return task

    def _task(
        self, body: JSON, thinking: bool, prefill: bool, prompt: str, tokens: list[str]
    ) -> _ChatTask:
        opts = body.get("stream_options")
        n_predict = _first_int(body, "n_predict", "max_completion_tokens", "max_tokens")
        return _ChatTask(
            model=str(body.get("model") or self.model_alias),
            stream=body.get("stream") is True,
            include_usage=isinstance(opts, dict) and opts.get("include_usage") is True,
            return_progress=body.get("return_progress") is True,
            timings_per_token=body.get("timings_per_token") is True,
            cache_prompt=body.get("cache_prompt") is not False,
            id_slot=_int_or(body.get("id_slot"), -1),
            n_predict=n_predict if n_predict is not None and n_predict >= 0 else None,
            thinking=thinking,
            prefill=prefill,
            prompt=prompt,
            prompt_tokens=tokens,
        )

    # ------------------------------------------------------------------ template

    def _render(
        self,
        messages: list[JSON],
        tools: list[Any],
        preserve: bool,
        thinking: bool,
        continue_mode: str,
    ) -> str:
        prefill = continue_mode != ""
        history = messages[:-1] if prefill else messages
        if not self.system_anywhere and any(_role(m) == "system" for m in messages[1:]):
            raise LlamaError(500, "System message must be at the beginning.")
        # Like Qwen templates: without preserve, only turns after the last user message
        # keep their reasoning block.
        last_user = max((i for i, m in enumerate(history) if m.get("role") == "user"), default=-1)
        out: list[str] = []
        start = 0
        if tools or (history and _role(history[0]) == "system"):
            has_system = bool(history) and _role(history[0]) == "system"
            system = self._content(history[0].get("content")) if has_system else ""
            out.append(_render_system(system, tools))
            start = 1 if has_system else 0
        for i in range(start, len(history)):
            out.append(self._render_message(history[i], preserve or i > last_user))
        out.append("<|im_start|>assistant\n")
        if prefill:
            last = messages[-1]
            out.append("<think>\n" + str(last.get("reasoning_content") or ""))
            if continue_mode == "content":
                out.append(self.close_reasoning + self._content(last.get("content")))
        elif not thinking and self.empty_think_when_off:
            out.append("<think>\n\n</think>\n\n")
        return "".join(out)

    def _render_message(self, msg: JSON, keep_think: bool) -> str:
        role = _role(msg)
        text = self._content(msg.get("content"))
        if role != "assistant":
            return f"<|im_start|>{role}\n{text}<|im_end|>\n"
        think = ""
        if keep_think:
            think = f"<think>\n{msg.get('reasoning_content') or ''}{self.close_reasoning}"
        calls = "".join(
            render_tool_call(
                c.get("function", {}).get("name", ""), c.get("function", {}).get("arguments", "")
            )
            for c in msg.get("tool_calls") or []
            if isinstance(c, dict)
        )
        return f"<|im_start|>assistant\n{think}{text}{calls}<|im_end|>\n"

    def _content(self, content: Any) -> str:
        if not isinstance(content, list):
            return content_text(content)
        out = []
        for part in content:
            if part.get("type") == "text":
                out.append(str(part.get("text", "")))
            else:
                out.append(MEDIA_MARKER)
        return "".join(out)

    # ------------------------------------------------------------------ slots and cache

    def _condition(self) -> asyncio.Condition:
        loop = asyncio.get_running_loop()
        if self._cond is None or self._cond_loop is not loop:
            # The fake may be served by several servers over its life, one loop each.
            self._cond = asyncio.Condition()
            self._cond_loop = loop
            self._busy.clear()
        return self._cond

    def _pick_slot(self, task: _ChatTask) -> int | None:
        self._resize_slots()
        if task.id_slot >= 0:
            slot = task.id_slot % self.total_slots
            return None if slot in self._busy else slot
        idle = [i for i in range(self.total_slots) if i not in self._busy]
        if not idle:
            return None
        # llama-server: the idle slot sharing the longest prefix, if that prefix is at least
        # `--slot-prompt-similarity` of the prompt; otherwise the least recently used one.
        prompt = task.prompt_tokens
        best = max(idle, key=lambda i: (common_prefix_len(self.slot_tokens[i], prompt), -i))
        lcp = common_prefix_len(self.slot_tokens[best], prompt)
        if lcp > 0 and lcp >= self.slot_prompt_similarity * len(prompt):
            return best
        return min(idle, key=lambda i: (self._last_used[i], i))

    def _resize_slots(self) -> None:
        n = self.total_slots
        if len(self.slot_tokens) != n:
            self.slot_tokens = (self.slot_tokens + [[] for _ in range(n)])[:n]
        if len(self._last_used) != n:
            self._last_used = (self._last_used + [-1] * n)[:n]
        if len(self.slot_info) != n:
            self.slot_info = (self.slot_info + [{} for _ in range(n)])[:n]

    async def _acquire_slot(self, task: _ChatTask) -> int:
        # Busy slots defer the task (llama-server queues; it never answers 429/503 for load).
        cond = self._condition()
        async with cond:
            while (slot := self._pick_slot(task)) is None:
                await cond.wait()
            self._busy.add(slot)
            self._use_counter += 1
            self._last_used[slot] = self._use_counter
            return slot

    async def _release_slot(self, slot: int) -> None:
        cond = self._condition()
        async with cond:
            self._busy.discard(slot)
            cond.notify_all()

    def _evaluate(self, task: _ChatTask, reply: Reply, slot: int) -> _Result:
        prompt = task.prompt_tokens
        lcp = common_prefix_len(self.slot_tokens[slot], prompt) if task.cache_prompt else 0
        cache_n = min(lcp, len(prompt) - 1)  # the last prompt token is always evaluated
        prompt_n = len(prompt) - cache_n
        calls = reply_tool_calls(reply)
        limit = self.n_ctx - len(prompt)  # context fills up: generation stops with "length"
        if task.n_predict is not None:
            limit = min(limit, task.n_predict)
        gen = generate(self._segments(task, reply, calls), calls, reply, limit)
        gen.tokens = self._sampled(gen.tokens)
        self.slot_tokens[slot] = prompt + gen.tokens
        self._note_slot(slot, task.prompt, gen.tokens)
        self.prompts.append(task.prompt)
        return _Result(
            id="chatcmpl-" + random_alnum(32),
            created=int(time.time()),
            model=task.model,
            cache_n=cache_n,
            prompt_n=prompt_n,
            n_prompt=len(prompt),
            gen=gen,
            timings=self._timings(cache_n, prompt_n, len(gen.tokens)),
            prefix_content=task.prefill_content if task.continue_mode == "content" else "",
            prefix_reasoning=task.prefill_reasoning,
        )

    def _sampled(self, tokens: list[str]) -> list[str]:
        """The canonical tokens as the model sampled them: some words split in two."""
        if self.split_rate <= 0 and not self.split_words:
            return tokens
        out: list[str] = []
        for token in tokens:
            word = len(token) >= 4 and token.isalnum()
            if word and (token in self.split_words or self._split_rng.random() < self.split_rate):
                half = len(token) // 2
                out += [token[:half], token[half:]]
            else:
                out.append(token)
        return out

    def _note_slot(self, slot: int, prompt: str, generated: list[str]) -> None:
        self.slot_info[slot] = {"prompt": prompt, "generated": "".join(generated)}

    # ------------------------------------------------------------------ other endpoints

    async def _slots(self, req: HttpRequest, send: Send) -> None:
        """`GET /slots`: each slot's last task, as the real server shows it."""
        self._resize_slots()
        out = []
        for i, info in enumerate(self.slot_info):
            busy = self.busy_elsewhere or i in self._busy
            slot: JSON = {"id": i, "n_ctx": self.n_ctx, "is_processing": busy}
            if info:
                # as the real one: the slot's cached tokens, and n_decoded reset once idle
                slot["n_prompt_tokens"] = len(self.slot_tokens[i])
                slot["next_token"] = [{"has_next_token": False, "n_decoded": 0}]
                if self.slots_debug:
                    slot["prompt"] = info["prompt"]
                    slot["generated"] = info["generated"]
            out.append(slot)
        await self._send(send, 200, out)

    async def _slot_action(self, req: HttpRequest, send: Send) -> None:
        """`POST /slots/{id}?action=erase|save|restore`, as llama-server run with
        `--slot-save-path` answers it, once the slot is not processing: an erased slot's
        tokens are gone; a saved one's are in a file of the folder, which a restore loads
        into a slot."""
        index = int(req.path.rsplit("/", 1)[1])
        query = req.query.split("&")
        if "action=save" in query or "action=restore" in query:
            await self._save_or_restore(req, send, index, "action=save" in query)
            return
        if "action=erase" not in query:
            raise LlamaError(400, "Invalid action")
        if not self.slot_actions:
            raise _no_slot_actions()
        slot = index % self.total_slots
        async with self._idle(slot):
            erased = len(self.slot_tokens[slot])
            self.slot_tokens[slot] = []
            self.slot_info[slot] = {}
        self.erased.append(slot)
        await self._send(send, 200, {"id_slot": slot, "n_erased": erased})

    @contextlib.asynccontextmanager
    async def _idle(self, slot: int) -> AsyncIterator[None]:
        """Slot ``slot`` once it is not processing, as llama-server runs a slot action."""
        self._resize_slots()
        cond = self._condition()
        async with cond:
            while slot in self._busy:
                await cond.wait()
            yield

    async def _save_or_restore(self, req: HttpRequest, send: Send, index: int, save: bool) -> None:
        folder = self.slot_save_path
        if folder is None or not self.slot_actions:
            raise _no_slot_actions()
        filename = _parse_body(req).get("filename")
        if not isinstance(filename, str) or not _valid_filename(filename):
            raise LlamaError(400, "Invalid filename")
        slot = index % self.total_slots
        async with self._idle(slot):
            path = folder / filename
            if save:
                tokens = self.slot_tokens[slot]
                state = {"model": self.model_path, "n_ctx": self.n_ctx, "tokens": tokens}
                data = SLOT_FILE_MAGIC + orjson.dumps(state)
                path.write_bytes(data)
                self.saved.append((slot, filename))
                answer: JSON = {
                    "id_slot": slot,
                    "filename": filename,
                    "n_saved": len(tokens),
                    "n_written": len(data),
                    "timings": {"save_ms": 1.0},
                }
            else:
                restored = self._read_slot_file(path)
                if restored is None:
                    raise LlamaError(
                        400,
                        "Unable to restore slot, no available space in KV cache or invalid "
                        "slot save file",
                    )
                self.slot_tokens[slot] = [] if self.restore_ineffective else restored
                self.slot_info[slot] = {}
                self.restored.append((slot, filename))
                answer = {
                    "id_slot": slot,
                    "filename": filename,
                    "n_restored": len(restored),
                    "n_read": path.stat().st_size,
                    "timings": {"restore_ms": 1.0},
                }
        await self._send(send, 200, answer)

    def _read_slot_file(self, path: Path) -> list[str] | None:
        """A slot file's tokens; None for one llama.cpp would refuse: missing, not begun
        with the state magic, cut short, or of another model's or context's layout."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if not data.startswith(SLOT_FILE_MAGIC):
            return None
        try:
            state = orjson.loads(data[len(SLOT_FILE_MAGIC) :])
        except orjson.JSONDecodeError:
            return None
        if state.get("model") != self.model_path or state.get("n_ctx") != self.n_ctx:
            return None
        tokens = state.get("tokens")
        return [str(t) for t in tokens] if isinstance(tokens, list) else None

    async def _apply_template(self, req: HttpRequest, send: Send) -> None:
        """`POST /apply-template`: the prompt a chat request renders to (its media loaded
        first, as the real server's parsing of a chat request loads them)."""
        body = _parse_body(req)
        await self._load_media(body)
        task = self._prepare(body)
        await self._send(send, 200, {"prompt": task.prompt})

    async def _tokenize(self, req: HttpRequest, send: Send) -> None:
        body = _parse_body(req)
        tokens = tokenize(str(body.get("content", "")))
        if body.get("with_pieces") is True:
            out: list[Any] = [{"id": i, "piece": t} for i, t in enumerate(tokens)]
        else:
            out = list(range(len(tokens)))
        await self._send(send, 200, {"tokens": out})

    async def _completion(self, req: HttpRequest, send: Send) -> None:
        """`POST /completion` with a text prompt; only `n_predict: 0` (evaluate, no answer)."""
        body = _parse_body(req)
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or body.get("n_predict") != 0:
            raise LlamaError(
                400, "the fake serves /completion only for a text prompt and n_predict 0"
            )
        tokens = tokenize(prompt)
        task = self._task(body, False, False, prompt, tokens)
        slot = await self._acquire_slot(task)
        try:
            await sleep_ms(self.completion_delay_ms)
            lcp = common_prefix_len(self.slot_tokens[slot], tokens) if task.cache_prompt else 0
            cache_n = min(lcp, len(tokens) - 1)
            self.slot_tokens[slot] = list(tokens)
            self._note_slot(slot, prompt, [])
            answer = {
                "content": "",
                "id_slot": slot,
                "stop": True,
                "tokens_predicted": 0,
                "tokens_evaluated": len(tokens),
                "tokens_cached": cache_n,
                "timings": self._timings(cache_n, len(tokens) - cache_n, 0),
            }
            await self._send(send, 200, answer)
        finally:
            await self._release_slot(slot)

    def _segments(self, task: _ChatTask, reply: Reply, calls: list[ToolCall]) -> list[Segment]:
        segments: list[Segment] = []
        content = reply.content
        if task.continue_mode == "reasoning":
            segments += [
                Segment("reasoning", _rest(reply.reasoning_content or "", task.prefill_reasoning)),
                Segment("markup", "\n</think>\n\n"),
            ]
        elif task.continue_mode == "content":
            content = _rest(content, task.prefill_content)
        elif task.thinking:
            segments += [
                Segment("markup", "<think>\n"),
                Segment("reasoning", reply.reasoning_content or ""),
                Segment("markup", self.close_reasoning),
            ]
        segments.append(Segment("content", content))
        for i, call in enumerate(calls):
            segments.append(Segment("tool", render_tool_call(call.name, call.arguments), i))
        return segments

    def _timings(self, cache_n: int, prompt_n: int, predicted_n: int) -> JSON:
        prompt_ms = prompt_n * self.prompt_ms_per_token
        predicted_ms = predicted_n * self.predicted_ms_per_token
        return {
            "cache_n": cache_n,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": _div(prompt_ms, prompt_n),
            "prompt_per_second": _div(1e3 * prompt_n, prompt_ms),
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": _div(predicted_ms, predicted_n),
            "predicted_per_second": _div(1e3 * predicted_n, predicted_ms),
        }

    # ------------------------------------------------------------------ responses

    @staticmethod
    def _usage(result: _Result) -> JSON:
        completion = len(result.gen.tokens)
        return {
            "completion_tokens": completion,
            "prompt_tokens": result.n_prompt,
            "total_tokens": result.n_prompt + completion,
            "prompt_tokens_details": {"cached_tokens": result.cache_n},
        }

    def _response(self, result: _Result) -> JSON:
        gen = result.gen
        message: JSON = {"role": "assistant", "content": result.prefix_content + gen.content}
        reasoning = result.prefix_reasoning + gen.reasoning
        if reasoning:
            message["reasoning_content"] = reasoning
        if gen.tool_calls:
            message["tool_calls"] = [
                {
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                    "id": c.id,
                }
                for c in gen.tool_calls
            ]
        return {
            "choices": [{"finish_reason": gen.finish_reason, "index": 0, "message": message}],
            "created": result.created,
            "model": result.model,
            "system_fingerprint": BUILD_INFO,
            "object": "chat.completion",
            "usage": self._usage(result),
            "id": result.id,
            "timings": result.timings,
        }

    def _chunk(self, result: _Result, choices: list[JSON]) -> JSON:
        return {
            "choices": choices,
            "created": result.created,
            "id": result.id,
            "model": result.model,
            "system_fingerprint": BUILD_INFO,
            "object": "chat.completion.chunk",
        }

    def _delta_chunk(self, result: _Result, delta: JSON) -> JSON:
        return self._chunk(result, [{"finish_reason": None, "index": 0, "delta": delta}])

    def _progress_chunks(self, result: _Result) -> list[JSON]:
        total, cache = result.n_prompt, result.cache_n
        batch = max(1, self.progress_batch)
        points = [cache, *range(cache + batch, total, batch), total]
        chunks = []
        for processed in points:
            chunk = self._delta_chunk(result, {"role": "assistant", "content": None})
            chunk["prompt_progress"] = {
                "total": total,
                "cache": cache,
                "processed": processed,
                "time_ms": int((processed - cache) * self.prompt_ms_per_token),
            }
            chunks.append(chunk)
        return chunks

    def _deltas(self, gen: Generated) -> list[tuple[JSON, int]]:
        """Stream deltas in llama-server's order, each with its token count."""
        per = self.tokens_per_chunk
        deltas: list[tuple[JSON, int]] = [({"role": "assistant", "content": None}, 0)]
        deltas += [
            ({"reasoning_content": f}, len(tokenize(f))) for f in fragments(gen.reasoning, per)
        ]
        deltas += [({"content": f}, len(tokenize(f))) for f in fragments(gen.content, per)]
        for i, call in enumerate(gen.tool_calls):
            head = {"index": i, "id": call.id, "type": "function"}
            head["function"] = {"name": call.name, "arguments": ""}
            deltas.append(({"tool_calls": [head]}, 0))
            deltas += [
                ({"tool_calls": [{"index": i, "function": {"arguments": f}}]}, len(tokenize(f)))
                for f in fragments(call.arguments, per)
            ]
        return deltas

    def _stream_chunks(self, task: _ChatTask, result: _Result) -> list[JSON]:
        chunks = self._progress_chunks(result) if task.return_progress else []
        emitted = 0
        deltas = self._deltas(result.gen)
        if task.echo_prefill:
            echo = {"reasoning_content": result.prefix_reasoning, "content": result.prefix_content}
            deltas[1:1] = [({k: v}, 0) for k, v in echo.items() if v]
        if _first_token_held(result.gen):
            del deltas[0]
        for delta, n_tokens in deltas:
            chunk = self._delta_chunk(result, delta)
            emitted += n_tokens
            if task.timings_per_token:
                chunk["timings"] = self._timings(result.cache_n, result.prompt_n, emitted)
            chunks.append(chunk)
        finish = {"finish_reason": result.gen.finish_reason, "index": 0, "delta": {}}
        chunks.append(self._chunk(result, [finish]))
        if task.include_usage:
            chunks.append({**self._chunk(result, []), "usage": self._usage(result)})
        chunks[-1]["timings"] = result.timings
        return chunks

    async def _stream(
        self, task: _ChatTask, reply: Reply, result: _Result, link: CallerLink
    ) -> None:
        headers = {
            "server": "llama.cpp",
            "content-type": "text/event-stream",
            "keep-alive": "timeout=5, max=100",
            **reply.headers,
        }
        chunks = [sse_event(c) for c in self._stream_chunks(task, result)]
        default = llama_error_body(reply.error_event_status or 500, "fake mid-stream error")
        error = sse_event(error_event_payload(reply, default["error"]))
        await play_stream(link, headers, chunks, reply, error_event=error, terminator=SSE_DONE)


# ---------------------------------------------------------------------- request checks


def _no_slot_actions() -> LlamaError:
    return LlamaError(
        501,
        "This server does not support slots action. Start it with `--slot-save-path`",
        "not_supported_error",
    )


def _valid_filename(name: str) -> bool:
    """A slot file's name as llama-server takes it: a plain name, no folder."""
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")


def _parse_body(req: HttpRequest) -> JSON:
    try:
        body = req.json()
    except orjson.JSONDecodeError as exc:
        raise LlamaError(400, f"[json.exception.parse_error.101] parse error: {exc}") from exc
    if not isinstance(body, dict):
        raise LlamaError(400, "'messages' is required")
    return body


def _continuation(body: JSON, messages: list[JSON]) -> tuple[str, bool]:
    """(how the final message is continued: "content", "reasoning" or "", whether the
    request asked for it with continue_final_message), as llama-server decides it."""
    explicit = _CONTINUE_MODES.get(orjson.dumps(body.get("continue_final_message")), "")
    add_generation_prompt = body.get("add_generation_prompt", True) is not False
    last = messages[-1] if messages else {}
    mode = explicit
    if not mode and last.get("role") == "assistant":  # --prefill-assistant, on by default
        if len(messages) > 1 and messages[-2].get("role") == "assistant":
            raise LlamaError(
                400, "Cannot have 2 or more assistant messages at the end of the list."
            )
        mode, add_generation_prompt = "auto", False
    if not mode:
        return "", False
    if add_generation_prompt:
        raise LlamaError(
            400, "Cannot set both add_generation_prompt and continue_final_message to true."
        )
    if last.get("role") == "assistant" and last.get("tool_calls"):
        raise LlamaError(400, "Cannot continue an assistant message that contains tool calls.")
    if mode == "auto":
        reasoning_only = last.get("reasoning_content") and not content_text(last.get("content"))
        mode = "reasoning" if reasoning_only else "content"
    return mode, explicit != ""


def _rest(full: str, shown: str) -> str:
    """What the model writes after ``shown``: the rest of ``full`` when it starts so."""
    return full[len(shown) :] if full.startswith(shown) else full


def _first_token_held(gen: Generated) -> bool:
    """llama-server sends the role with the first generated token's chunk, but holds back a
    token that is an incomplete UTF-8 sequence — the first bytes of an emoji, which a
    byte-level vocabulary splits — so an answer that opens with one has no role chunk."""
    first = (gen.reasoning or gen.content)[:1]
    return len(first.encode()) >= 4


def _role(msg: JSON) -> str:
    role = str(msg.get("role"))
    return "system" if role == "developer" else role


def _render_system(system: str, tools: list[Any]) -> str:
    if tools:
        lines = "\n".join(orjson.dumps(t).decode() for t in tools)
        system = f"{system}\n\n# Tools\n\n<tools>\n{lines}\n</tools>".lstrip("\n")
    return f"<|im_start|>system\n{system}<|im_end|>\n"


def _check_response_format(body: JSON) -> None:
    fmt = body.get("response_format")
    if "response_format" not in body or not isinstance(fmt, dict):
        return
    kind = fmt.get("type")
    if isinstance(kind, str) and kind not in ("", "text", "json_object", "json_schema"):
        raise LlamaError(
            400, f'response_format type must be one of "text" or "json_object", but got: {kind}'
        )


@dataclass(frozen=True, slots=True)
class _Modalities:
    """What the server's multimodal projector takes (`/props` `modalities`)."""

    vision: bool
    audio: bool
    video: bool


def _media_source(part: Any) -> str:
    """Where a media part's bytes are, as the real server reads it ("" for none)."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "image_url":
        value = part.get("image_url")
        url = value.get("url") if isinstance(value, dict) else None
    elif kind in ("input_audio", "input_video", "video_url"):
        value = part.get(kind)
        url = value.get("data", value.get("url")) if isinstance(value, dict) else None
    else:
        url = None
    return url if isinstance(url, str) else ""


def _check_messages(body: JSON, modalities: _Modalities) -> list[JSON]:
    if "messages" not in body:
        raise LlamaError(400, "'messages' is required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise LlamaError(400, "Expected 'messages' to be an array")
    for msg in messages:
        _check_message(msg, modalities)
    return messages


def _check_message(msg: Any, modalities: _Modalities) -> None:
    if not isinstance(msg, dict):
        raise LlamaError(500, f"Failed to parse messages: Expected a message object: {msg!r}")
    role = msg.get("role")
    if role != "assistant" and "content" not in msg:
        raise LlamaError(400, "All non-assistant messages must contain 'content'")
    if role == "assistant" and "content" not in msg and "tool_calls" not in msg:
        raise LlamaError(400, "Assistant message must contain either 'content' or 'tool_calls'!")
    content = msg.get("content")
    if isinstance(content, list):
        for part in content:
            _check_part(part, modalities)
    elif content is not None and not isinstance(content, str):
        raise LlamaError(400, "Expected 'content' to be a string or an array")
    if not isinstance(role, str):
        dumped = orjson.dumps(msg).decode()
        raise LlamaError(500, f"Failed to parse messages: Missing 'role' in message: {dumped}")


def _check_part(part: Any, modalities: _Modalities) -> None:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "image_url" and not modalities.vision:
        raise LlamaError(500, f"image {_MMPROJ_HINT}")
    if kind == "input_audio" and not modalities.audio:
        raise LlamaError(500, f"audio {_MMPROJ_HINT}")
    if kind in ("input_video", "video_url") and not modalities.video:
        raise LlamaError(500, f"video {_MMPROJ_HINT}")
    if kind not in ("text", "image_url", "input_audio", "input_video", "video_url"):
        raise LlamaError(400, "unsupported content[].type")


def _parse_tool_choice(body: JSON) -> str:
    choice = body.get("tool_choice", "auto")
    if not isinstance(choice, str):
        return "auto"  # an object (OpenAI's named-function form) is a type mismatch ⇒ default
    if choice not in _TOOL_CHOICES:
        raise LlamaError(400, f"Invalid tool_choice: {choice}")
    return choice


def _check_reasoning_format(body: JSON) -> None:
    value = body.get("reasoning_format")
    if value is not None and value not in _REASONING_FORMATS:
        raise LlamaError(500, f"Unknown reasoning format: {value}")


def _enable_thinking(kwargs: JSON, body: JSON) -> bool:
    value = kwargs.get("enable_thinking")
    if isinstance(value, str):
        raise LlamaError(400, 'invalid type for "enable_thinking" (expected boolean, got string)')
    return value is not False and body.get("reasoning_effort") != "none"


def _check_logprobs(body: JSON) -> None:
    if body.get("logprobs") is True:
        if body.get("tools") and body.get("stream") is True:
            raise LlamaError(400, "logprobs is not supported with tools + stream")
    elif body.get("top_logprobs") is not None:
        raise LlamaError(400, "top_logprobs requires logprobs to be set to true")


def _check_n(body: JSON, total_slots: int) -> None:
    for key in ("n", "n_cmpl"):
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or not 1 <= value <= total_slots:
            bounds = f"1 <= value <= {total_slots}"
            raise LlamaError(400, f"Field '{key}': Value must be between {bounds}, but got {value}")


def _first_int(body: JSON, *keys: str) -> int | None:
    for key in keys:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _int_or(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _div(a: float, b: float) -> float | None:
    # llama-server divides doubles; 0/0 and x/0 give NaN/inf, which JSON writes as null.
    return a / b if b else None
