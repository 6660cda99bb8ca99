"""One gateway in front of a fake of every provider kind, and answers that break mid-stream.

Each kind scripts the same two answers — a text and two streamed tool calls — as
the fake of that kind streams them, and a break after some of the answer was
shown: in the text, or inside the first tool call's arguments (Gemini sends a
call whole, so there the break falls between the two calls).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from boundedcode_gateway.app import create_app
from boundedcode_gateway.config import parse_config
from boundedcode_gateway.ingress.server import GatheringHttpToolsProtocol
from tests.e2e.conftest import COMPAT_KEY, OPENAI_KEY, Gateway
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.common import Reply
from tests.fakes.gemini_api import FakeGemini
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.server import serve_in_thread, stop_all

ANTHROPIC_KEY = "sk-ant-test-0123456789"
GEMINI_KEY = "AIza-test-gemini-key-0123"

ANSWER = "The weather in Paris is mild and sunny today, with a light breeze."
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("get_weather", {"city": "Paris"}),
    ("get_weather", {"city": "Lyon"}),
]
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris and Lyon?"}]
AWARE = {"X-BoundedCode-Stream-Discard": "1"}


@dataclass
class Fakes:
    llama: FakeLlamaServer
    other: FakeLlamaServer
    openai: FakeOpenAI
    compat: FakeOpenAI
    claude: FakeAnthropic
    gemini: FakeGemini
    profiles: dict[str, dict[str, Any]]

    def reset(self) -> None:
        for fake in (self.llama, self.other, self.openai, self.compat, self.claude, self.gemini):
            fake.replies.clear()


def _openai_tool_calls() -> list[dict[str, Any]]:
    return [{"name": n, "arguments": f'{{"city": "{a["city"]}"}}'} for n, a in CALLS]


def _openai_shaped(attr: str, lead: int) -> tuple[Callable[..., None], Callable[..., None]]:
    """``lead``: stream events before the role chunk (llama.cpp's prompt progress)."""

    def text(fakes: Fakes, *later: Reply) -> None:
        # the role chunk, then four tokens of the text
        broken = Reply(content=ANSWER, break_after_chunks=lead + 5)
        getattr(fakes, attr).queue(broken, *later or [Reply(content=ANSWER)])

    def tools(fakes: Fakes, *later: Reply) -> None:
        # the role chunk, the first call's head, three pieces of its arguments
        broken = Reply(content="", tool_calls=_openai_tool_calls(), break_after_chunks=lead + 5)
        whole = Reply(content="", tool_calls=_openai_tool_calls())
        getattr(fakes, attr).queue(broken, *later or [whole])

    return text, tools


def _anthropic_text(fakes: Fakes, *later: Reply) -> None:
    # message_start, ping, the text block's start, four text deltas
    broken = Reply(content=ANSWER, break_after_chunks=7)
    fakes.claude.queue(broken, *later or [Reply(content=ANSWER)])


def _anthropic_tools(fakes: Fakes, *later: Reply) -> None:
    calls = [{"name": n, "arguments": a} for n, a in CALLS]
    # message_start, ping, the first tool block's start, its empty delta, three pieces
    broken = Reply(content="", tool_calls=calls, break_after_chunks=7)
    fakes.claude.queue(broken, *later or [Reply(content="", tool_calls=calls)])


def _gemini_text(fakes: Fakes, *later: Reply) -> None:
    # two chunks of two tokens each
    fakes.gemini.queue(
        Reply(content=ANSWER, break_after_chunks=2), *later or [Reply(content=ANSWER)]
    )


def _gemini_tools(fakes: Fakes, *later: Reply) -> None:
    calls = [{"name": n, "arguments": a} for n, a in CALLS]
    # the first call, whole; the connection drops before the second
    broken = Reply(content="", tool_calls=calls, break_after_chunks=1)
    fakes.gemini.queue(broken, *later or [Reply(content="", tool_calls=calls)])


@dataclass(frozen=True)
class Kind:
    profile: str
    queue_text: Callable[..., None]
    queue_tools: Callable[..., None]
    # a llama.cpp server continues a text answer where it broke instead of answering again
    continues_text: bool = False


def _kinds() -> list[Kind]:
    local = _openai_shaped("llama", lead=2)
    other = _openai_shaped("other", lead=0)
    gpt = _openai_shaped("openai", lead=0)
    glm = _openai_shaped("compat", lead=0)
    return [
        Kind("local", *local, continues_text=True),
        Kind("other", *other),
        Kind("gpt", *gpt),
        Kind("glm", *glm),
        Kind("claude", _anthropic_text, _anthropic_tools),
        Kind("gem", _gemini_text, _gemini_tools),
    ]


KINDS = _kinds()


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    """Every kind's fake for the module; each test starts with empty reply queues."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TEST_OPENAI_KEY", OPENAI_KEY)
        mp.setenv("TEST_COMPAT_KEY", COMPAT_KEY)
        mp.setenv("TEST_ANTHROPIC_KEY", ANTHROPIC_KEY)
        mp.setenv("TEST_GEMINI_KEY", GEMINI_KEY)
        # one prompt-progress chunk at the start and one at the end, whatever the prompt
        llama = FakeLlamaServer(progress_batch=1_000_000)
        other = FakeLlamaServer(props_enabled=False, thinking=False)
        oai = FakeOpenAI(api_key=OPENAI_KEY, models={"gpt-5.1"})
        compat = FakeOpenAI(api_key=COMPAT_KEY, models={"glm-5"}, path_prefix="/api/paas/v4")
        claude = FakeAnthropic(api_key=ANTHROPIC_KEY)
        gemini = FakeGemini(api_key=GEMINI_KEY, models={"gemini-3-pro-preview"})
        apps = (llama.app, other.app, oai.app, compat.app, claude.app, gemini.app)
        servers = [serve_in_thread(app) for app in apps]
        url = [s.url for s in servers]
        profiles: dict[str, dict[str, Any]] = {
            "local": {"provider": "local", "external_url": url[0]},
            "other": {"provider": "local", "external_url": url[1]},
            "gpt": {
                "provider": "openai",
                "model": "gpt-5.1",
                "api_key_env": "TEST_OPENAI_KEY",
                "base_url": url[2] + "/v1",
            },
            "glm": {
                "provider": "openai-compatible",
                "model": "glm-5",
                "api_key_env": "TEST_COMPAT_KEY",
                "base_url": url[3] + "/api/paas/v4",
            },
            "claude": {
                "provider": "anthropic",
                "model": "claude-haiku-4-5",
                "api_key_env": "TEST_ANTHROPIC_KEY",
                "base_url": url[4] + "/v1",
            },
            "gem": {
                "provider": "gemini",
                "model": "gemini-3-pro-preview",
                "api_key_env": "TEST_GEMINI_KEY",
                "base_url": url[5] + "/v1beta",
            },
        }
        try:
            yield Fakes(llama, other, oai, compat, claude, gemini, profiles)
        finally:
            stop_all(servers)


def start_gateway_on(data_dir: Path, profiles: dict[str, Any]) -> Gateway:
    """A gateway with ``profiles`` (the fakes' and any more), served as ``serve`` serves
    it, for a module's tests; the caller stops it."""
    text = yaml.safe_dump({"data_dir": str(data_dir), "models": profiles})
    app = create_app(parse_config(text))
    server = serve_in_thread(app, lifespan="on", http=GatheringHttpToolsProtocol)
    return Gateway(app, server, data_dir)
