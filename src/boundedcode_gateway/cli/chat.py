"""``boundedcode-gateway chat``: a terminal client for a running gateway.

Streams answers; while a local server reads a long prompt it shows one live
line — "reading the conversation: 3.1k of 7.8k new tokens" — replaced by the
answer when generation starts. It declares that it understands the discard
event: when a broken answer is sent again, what was shown of it is erased and
only the new answer is kept in the history. A gateway with caller keys is sent the
key in ``$BOUNDEDCODE_GATEWAY_KEY`` (a key or a task token).
"""

from __future__ import annotations

import http.client
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import orjson

from boundedcode_gateway.discard import HEADER_NAME as DISCARD_HEADER

# the caller key (or task token) the chat sends, when the gateway has auth:
KEY_ENV = "BOUNDEDCODE_GATEWAY_KEY"
CLEAR_LINE = "\r\033[K"
ERASE_BELOW = "\033[J"
RESTART_NOTICE = "(the answer broke off; it starts again)"


def format_tokens(n: int) -> str:
    """Token counts as a person reads them: 950, 3.1k, 12.4k."""
    return str(n) if n < 1000 else f"{n / 1000:.1f}k"


def progress_line(progress: dict[str, Any]) -> str:
    """New tokens are total minus cache, done are processed minus cache (docs/llama-server.md)."""
    cache = int(progress.get("cache", 0))
    new = int(progress.get("total", 0)) - cache
    done = int(progress.get("processed", 0)) - cache
    return f"reading the conversation: {format_tokens(done)} of {format_tokens(new)} new tokens"


def erase_sequence(shown: str, columns: int) -> str:
    """Terminal codes that go back to where ``shown`` began and clear everything after."""
    rows = sum(max(1, -(-len(line) // columns)) for line in shown.split("\n"))
    up = rows - 1
    return "\r" + (f"\033[{up}A" if up else "") + ERASE_BELOW


def is_discard(chunk: dict[str, Any]) -> bool:
    extension = chunk.get("boundedcode")
    return isinstance(extension, dict) and extension.get("event") == "discard"


def load_history(path: str | None) -> list[dict[str, Any]]:
    """Earlier messages from a JSON file: a list of messages or ``{"messages": [...]}``."""
    if not path:
        return []
    data = orjson.loads(Path(path).read_bytes())
    messages = data.get("messages") if isinstance(data, dict) else data
    if not isinstance(messages, list):
        raise SystemExit(f"{path}: expected a list of messages")
    return messages


class GatewayClient:
    """Plain HTTP/1.1 to the gateway; one connection per request."""

    def __init__(self, url: str, api_key: str | None = None) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        # Connection: close hands the socket to the response, closed once it is read
        self.headers = {
            "Content-Type": "application/json",
            "Connection": "close",
            DISCARD_HEADER: "1",
        }
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def _request(self, method: str, path: str, body: Any = None) -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=None)
        payload = orjson.dumps(body) if body is not None else None
        conn.request(method, self.prefix + path, body=payload, headers=self.headers)
        return conn.getresponse()

    def prompt_progress(self, model: str) -> bool:
        with self._request("GET", f"/v1/models/{model}") as resp:
            info = orjson.loads(resp.read())
        if resp.status != 200:
            raise SystemExit(info.get("error", {}).get("message", f"HTTP {resp.status}"))
        return bool(info["capabilities"]["prompt_progress"])

    def stream(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The chunks of a streamed answer; an error answer is raised as ``RuntimeError``."""
        with self._request("POST", "/v1/chat/completions", body) as resp:
            if resp.status != 200:
                raise RuntimeError(orjson.loads(resp.read())["error"]["message"])
            while line := resp.readline():
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    return
                chunk = orjson.loads(data)
                if "error" in chunk:
                    raise RuntimeError(chunk["error"]["message"])
                yield chunk


class AnswerView:
    """One answer on the terminal: a status line that the text replaces, the text, and
    the assistant message it adds up to."""

    def __init__(self, out: TextIO, columns: int) -> None:
        self._out = out
        self._columns = columns
        self._status = False
        self._shown: list[str] = []
        self._content: list[str] = []
        self._reasoning: list[str] = []

    def status(self, line: str) -> None:
        self._out.write(CLEAR_LINE + line)
        self._out.flush()
        self._status = True

    def text(self, text: str, is_content: bool) -> None:
        if self._status:
            self._out.write(CLEAR_LINE)
            self._status = False
        (self._content if is_content else self._reasoning).append(text)
        self._shown.append(text)
        self._out.write(text)
        self._out.flush()

    def discard(self) -> None:
        """Erase what was shown of this answer; it starts again."""
        if self._shown:
            self._out.write(erase_sequence("".join(self._shown), self._columns))
        self._shown.clear()
        self._content.clear()
        self._reasoning.clear()
        self.status(RESTART_NOTICE)

    def end(self) -> dict[str, Any]:
        if self._status:
            self._out.write(CLEAR_LINE)
        self._out.write("\n")
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._content)}
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        return message


def show_answer(
    chunks: Iterator[dict[str, Any]], out: TextIO, columns: int | None = None
) -> dict[str, Any]:
    """Write progress, then the answer as it streams; return the assistant message."""
    view = AnswerView(out, columns or shutil.get_terminal_size().columns)
    for chunk in chunks:
        if "prompt_progress" in chunk:
            view.status(progress_line(chunk["prompt_progress"]))
            continue
        if is_discard(chunk):
            view.discard()
            continue
        delta = chunk["choices"][0].get("delta", {}) if chunk.get("choices") else {}
        text = delta.get("content") or delta.get("reasoning_content")
        if text:
            view.text(text, is_content=bool(delta.get("content")))
    return view.end()


def _inputs(messages: list[str] | None) -> Iterator[str]:
    if messages:
        yield from messages
        return
    while True:
        try:
            line = input("you> ")
        except EOFError:
            return
        if line.strip():
            yield line


def run_chat(
    url: str,
    model: str,
    history_file: str | None,
    messages: list[str] | None,
    api_key: str | None = None,
) -> int:
    """The chat loop: read, send with the history, stream the answer, keep it."""
    client = GatewayClient(url, api_key)
    progress = client.prompt_progress(model)
    history = load_history(history_file)
    for text in _inputs(messages):
        history.append({"role": "user", "content": text})
        body: dict[str, Any] = {"model": model, "messages": history, "stream": True}
        if progress:
            body["return_progress"] = True
        try:
            history.append(show_answer(client.stream(body), sys.stdout))
        except RuntimeError as exc:
            print(f"{CLEAR_LINE}error: {exc}", file=sys.stderr)
            history.pop()
    return 0
