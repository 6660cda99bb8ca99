"""Fake Gemini API: `POST /v1beta/models/{model}:generateContent` and
`:streamGenerateContent?alt=sse`.

Owns Gemini's JSON shapes. Incoming bodies are checked with the official `google-genai`
types (REST camelCase, unknown fields refused), so the gateway's translation is checked by
code it did not write. Thought signatures are issued on every answer as Gemini 3 does (on
the first of parallel function calls; on the last part of a text answer, which a stream
sends as a signature-only part) and enforced as Gemini 3 does: in the current turn, each
function-call step's first `functionCall` part must carry the exact signature issued for
it, else 400 with the documented text. Answers come from `Reply` scripts (`content` is the
text, `reasoning_content` a thought part, `tool_calls` function calls with an optional pinned
`id`, `finish_reason` a Gemini finishReason); the faults are the shared script's, an
in-stream error being sent as a one-element JSON array.
"""

from __future__ import annotations

import base64
import secrets
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson
import pydantic
from google.genai import types

from tests.fakes.common import (
    JSON,
    CallerLink,
    ClientGone,
    Receive,
    Recorder,
    Reply,
    Scope,
    Segment,
    Send,
    ToolCall,
    default_reply,
    fragments,
    generate,
    play_stream,
    play_whole,
    random_alnum,
    read_request,
    send_json,
    sse_event,
    tokenize,
    wait_to_answer,
)

PLACEHOLDER = "skip_thought_signature_validator"
MISSING_SIGNATURE = (
    "Function call is missing a thought_signature in functionCall parts. This is required for "
    "tools to work correctly, and missing thought_signature may lead to degraded model "
    "performance. Additional data, function call `default_api:{name}` , position {position}. "
    "Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
)
# Google's wording for a signature it did not issue is not documented; this one is the fake's
INVALID_SIGNATURE = "Thought signature is not valid for this request."
TOP_LEVEL_TYPES: dict[str, Any] = {
    "systemInstruction": types.Content,
    "toolConfig": types.ToolConfig,
    "generationConfig": types.GenerationConfig,
}
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
DEFAULT_MESSAGES = {
    429: "Resource has been exhausted (e.g. check quota).",
    500: "An internal error has occurred. Please retry or report in "
    "https://developers.generativeai.google/guide/troubleshooting",
    503: "The model is overloaded. Please try again later.",
}


def _error_for(status: int) -> JSON:
    return gemini_error_body(status, DEFAULT_MESSAGES.get(status, "Request failed."))


def gemini_error_body(status: int, message: str) -> JSON:
    """Gemini's error body: `{"error": {"code", "message", "status"}}`."""
    return {
        "error": {"code": status, "message": message, "status": STATUS_NAMES.get(status, "UNKNOWN")}
    }


class GeminiError(Exception):
    """A request the fake refuses."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.body = gemini_error_body(status, message)
        self.headers = headers or {}


def _invalid(message: str) -> GeminiError:
    return GeminiError(400, message)


@dataclass(frozen=True)
class Issued:
    """What a signature was issued on: a function call (name, args) or a text answer."""

    kind: str
    name: str
    args: bytes


class FakeGemini:
    """Fake Gemini v1beta `generateContent` / `streamGenerateContent`.

    Knobs are plain attributes: `enforce_signatures` (the Gemini 3 rule), `context_window`,
    `cached_tokens` (reported as `cachedContentTokenCount`), `chunk_tokens` (text tokens per
    stream chunk).
    """

    def __init__(
        self,
        *,
        api_key: str = "gemini-test-key",
        models: set[str] | None = None,
        context_window: int = 1_000_000,
        enforce_signatures: bool = True,
        chunk_tokens: int = 2,
    ) -> None:
        self.api_key = api_key
        self.models: set[str] = set(models) if models is not None else {"gemini-3-pro-preview"}
        self.context_window = context_window
        self.enforce_signatures = enforce_signatures
        self.chunk_tokens = chunk_tokens
        self.cached_tokens = 0
        self.requests = Recorder()
        self.replies: deque[Reply] = deque()
        self.issued: dict[str, Issued] = {}
        self.refused: list[str] = []

    def queue(self, *replies: Reply) -> None:
        """Queue answers for the next generate requests, in order."""
        self.replies.extend(replies)

    # ------------------------------------------------------------------ ASGI entry

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI application."""
        if scope["type"] != "http":
            return
        req = await read_request(scope, receive)
        self.requests.append(req.record())
        link = CallerLink(receive, send)
        try:
            await self._dispatch(req.method, req.path, req.query, req.headers, req.raw_body, link)
        except GeminiError as exc:
            self.refused.append(str(exc))
            await _send(link.send, exc.status, exc.body, exc.headers)
        except ClientGone:
            pass
        finally:
            link.close()

    async def _dispatch(
        self,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        raw: bytes,
        link: CallerLink,
    ) -> None:
        key = headers.get("x-goog-api-key")
        if not key:
            raise GeminiError(
                403,
                "Method doesn't allow unregistered callers (callers without established "
                "identity). Please use API Key or other form of API consumer identity to call "
                "this API.",
            )
        if key != self.api_key:
            raise _invalid("API key not valid. Please pass a valid API key.")
        prefix = "/v1beta/models/"
        model, _, action = path.removeprefix(prefix).partition(":")
        if method != "POST" or not path.startswith(prefix) or not action:
            raise GeminiError(404, f"Invalid URL ({method} {path})")
        if model not in self.models:
            raise GeminiError(
                404,
                f"models/{model} is not found for API version v1beta, or is not supported for "
                "generateContent.",
            )
        if action == "generateContent":
            await self._generate(model, raw, False, link)
        elif action == "streamGenerateContent" and "alt=sse" in query:
            await self._generate(model, raw, True, link)
        else:
            raise GeminiError(404, f"Invalid action {action!r}")

    # ------------------------------------------------------------------ checks

    def _validate(self, raw: bytes) -> JSON:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise _invalid("Invalid JSON payload received.") from None
        if not isinstance(body, dict) or not isinstance(body.get("contents"), list):
            raise _invalid("* GenerateContentRequest.contents: contents is not specified")
        allowed = {"contents", "tools", "safetySettings", "cachedContent", *TOP_LEVEL_TYPES}
        for key in body:
            if key not in allowed:
                raise _invalid(
                    f'Invalid JSON payload received. Unknown name "{key}": Cannot find field.'
                )
        _check_types(body)
        thinking = (body.get("generationConfig") or {}).get("thinkingConfig") or {}
        if "thinkingLevel" in thinking and "thinkingBudget" in thinking:
            raise _invalid("You can only set only one of thinking budget and thinking level.")
        self._check_responses(body["contents"])
        if self.enforce_signatures:
            self._check_signatures(body["contents"])
        return body

    @staticmethod
    def _check_responses(contents: list[JSON]) -> None:
        for i, content in enumerate(contents):
            calls = [p for p in content["parts"] if "functionCall" in p]
            if content["role"] != "model" or not calls:
                continue
            after = contents[i + 1] if i + 1 < len(contents) else None
            answers = [p for p in (after or {}).get("parts", ()) if "functionResponse" in p]
            if after is not None and len(answers) != len(calls):
                raise _invalid(
                    "Please ensure that the number of function response parts is equal to the "
                    "number of function call parts of the function call turn."
                )

    def _check_signatures(self, contents: list[JSON]) -> None:
        for content in contents:
            for part in content["parts"]:
                sig = part.get("thoughtSignature")
                if sig is not None and sig != PLACEHOLDER and sig not in self.issued:
                    raise _invalid(INVALID_SIGNATURE)
        start = 0
        for i in range(len(contents) - 1, -1, -1):
            c = contents[i]
            if c["role"] == "user" and any("functionResponse" not in p for p in c["parts"]):
                start = i + 1
                break
        for position in range(start, len(contents)):
            content = contents[position]
            calls = [p for p in content["parts"] if "functionCall" in p]
            if content["role"] != "model" or not calls:
                continue
            first = calls[0]
            sig = first.get("thoughtSignature")
            if sig is None:
                name = first["functionCall"].get("name", "")
                raise _invalid(MISSING_SIGNATURE.format(name=name, position=position))
            if sig == PLACEHOLDER:
                continue
            call = first["functionCall"]
            expected = Issued("call", call.get("name", ""), _args(call.get("args")))
            if self.issued.get(sig) != expected:
                raise _invalid(INVALID_SIGNATURE)

    def _prompt_tokens(self, body: JSON) -> int:
        text = orjson.dumps(
            [body.get("systemInstruction"), body["contents"], body.get("tools")]
        ).decode()
        n = len(tokenize(text))
        if n > self.context_window:
            raise _invalid(
                f"The input token count ({n}) exceeds the maximum number of tokens allowed "
                f"({self.context_window})."
            )
        return n

    # ------------------------------------------------------------------ answers

    async def _generate(self, model: str, raw: bytes, stream: bool, link: CallerLink) -> None:
        reply = self.replies.popleft() if self.replies else None
        if reply is not None and reply.status is not None:
            if await wait_to_answer(link, reply):
                body = reply.error_body or _error_for(reply.status)
                await _send(link.send, reply.status, body, reply.headers)
            return
        try:
            body = self._validate(raw)
            prompt = self._prompt_tokens(body)
        except GeminiError:
            if reply is not None:  # a refused request does not use up the scripted answer
                self.replies.appendleft(reply)
            raise
        reply = reply or default_reply(_last_user_text(body["contents"]))
        if not await wait_to_answer(link, reply):
            return
        answer = self._answer(model, body, reply, prompt)
        if stream:
            await self._stream(answer, reply, link)
        else:
            headers = {"content-type": "application/json", **reply.headers}
            await play_whole(link, 200, answer.whole(), headers, reply)

    def _sign(self, issued: Issued) -> str:
        sig = base64.b64encode(secrets.token_bytes(24)).decode()
        self.issued[sig] = issued
        return sig

    def _answer(self, model: str, body: JSON, reply: Reply, prompt: int) -> _Answer:
        specs = reply.tool_calls or []
        calls = [
            ToolCall(str(s.get("id") or ""), str(s["name"]), orjson.dumps(_spec_args(s)).decode())
            for s in specs
        ]
        segments = [
            Segment("reasoning", reply.reasoning_content or ""),
            Segment("content", reply.content),
        ]
        segments += [Segment("tool", c.name + c.arguments, i) for i, c in enumerate(calls)]
        limit = (body.get("generationConfig") or {}).get("maxOutputTokens")
        gen = generate(segments, calls, reply, limit if isinstance(limit, int) else None)
        finish = reply.finish_reason or ("MAX_TOKENS" if gen.finish_reason == "length" else "STOP")
        call_parts: list[JSON] = []
        for i, call in enumerate(gen.tool_calls):
            fc: JSON = {"name": call.name, "args": orjson.loads(call.arguments)}
            if call.id:
                fc["id"] = call.id
            part: JSON = {"functionCall": fc}
            if i == 0:  # parallel calls: only the first carries the signature
                part["thoughtSignature"] = self._sign(Issued("call", call.name, _args(fc["args"])))
            call_parts.append(part)
        text_sig = None if call_parts else self._sign(Issued("text", "", gen.content.encode()))
        usage = {
            "promptTokenCount": prompt,
            "candidatesTokenCount": len(gen.tokens) - gen.reasoning_tokens,
            "thoughtsTokenCount": gen.reasoning_tokens,
            "totalTokenCount": prompt + len(gen.tokens),
        }
        if self.cached_tokens:
            usage["cachedContentTokenCount"] = min(self.cached_tokens, prompt)
        return _Answer(
            response_id=random_alnum(22),
            model=model,
            thoughts=gen.reasoning,
            text=gen.content,
            call_parts=call_parts,
            text_signature=text_sig,
            finish=finish,
            usage=usage,
            chunk_tokens=self.chunk_tokens,
        )

    async def _stream(self, answer: _Answer, reply: Reply, link: CallerLink) -> None:
        headers = {"content-type": "text/event-stream", **reply.headers}
        chunks = [sse_event(c) for c in answer.chunks()]
        error = reply.error_event or _error_for(reply.error_event_status or 503)
        # Gemini's stream error: a one-element array; the stream has no terminator
        await play_stream(link, headers, chunks, reply, error_event=sse_event([error]))


@dataclass
class _Answer:
    """One generated answer, as a whole response or as stream chunks."""

    response_id: str
    model: str
    thoughts: str
    text: str
    call_parts: list[JSON]
    text_signature: str | None
    finish: str
    usage: JSON
    chunk_tokens: int

    def _response(self, parts: list[JSON], last: bool) -> JSON:
        candidate: JSON = {"content": {"role": "model", "parts": parts}, "index": 0}
        out: JSON = {"candidates": [candidate], "modelVersion": self.model}
        out["responseId"] = self.response_id
        if last:
            candidate["finishReason"] = self.finish
        out["usageMetadata"] = self.usage if last else _partial_usage(self.usage)
        return out

    def whole(self) -> JSON:
        parts: list[JSON] = []
        if self.thoughts:
            parts.append({"text": self.thoughts, "thought": True})
        if self.text:
            parts.append({"text": self.text})
        parts += self.call_parts
        if self.text_signature is not None:
            if parts and "text" in parts[-1] and "thought" not in parts[-1]:
                parts[-1]["thoughtSignature"] = self.text_signature
            else:
                parts.append({"text": "", "thoughtSignature": self.text_signature})
        return self._response(parts, True)

    def chunks(self) -> list[JSON]:
        groups: list[list[JSON]] = []
        groups += [
            [{"text": f, "thought": True}] for f in fragments(self.thoughts, self.chunk_tokens)
        ]
        groups += [[{"text": f}] for f in fragments(self.text, self.chunk_tokens)]
        groups += [[p] for p in self.call_parts]
        if self.text_signature is not None:
            # a text answer ends with a signature-only part, as Gemini streams it
            groups.append([{"text": "", "thoughtSignature": self.text_signature}])
        if not groups:
            groups.append([])
        last = len(groups) - 1
        return [self._response(g, i == last) for i, g in enumerate(groups)]


def _check_types(body: JSON) -> None:
    """Every part of the body through the official request types (REST camelCase)."""
    try:
        for content in body["contents"]:
            types.Content.model_validate(content)
            if content.get("role") not in ("user", "model") or not content.get("parts"):
                raise _invalid("* GenerateContentRequest.contents: role and parts are required")
        for tool in body.get("tools") or ():
            types.Tool.model_validate(tool)
        for key, model_type in TOP_LEVEL_TYPES.items():
            if key in body:
                model_type.model_validate(body[key])
    except pydantic.ValidationError as exc:
        raise _invalid(f"Invalid JSON payload received. {exc.errors()[0]['msg']}") from None


def _partial_usage(usage: JSON) -> JSON:
    return {
        "promptTokenCount": usage["promptTokenCount"],
        "totalTokenCount": usage["promptTokenCount"],
    }


def _args(args: Any) -> bytes:
    return orjson.dumps(args if isinstance(args, dict) else {}, option=orjson.OPT_SORT_KEYS)


def _spec_args(spec: dict[str, Any]) -> Any:
    args = spec.get("arguments", {})
    return orjson.loads(args) if isinstance(args, str) else args


def _last_user_text(contents: list[JSON]) -> list[JSON]:
    """The contents as OpenAI-like messages, enough for `default_reply`."""
    return [
        {"role": "user", "content": "".join(p.get("text", "") for p in c["parts"])}
        for c in contents
        if c["role"] == "user"
    ]


async def _send(send: Send, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
    await send_json(send, status, obj, {"content-type": "application/json", **(headers or {})})
