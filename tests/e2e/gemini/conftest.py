"""The fake Gemini API and the profiles that point at it (the gateway fixtures are the
parent folder's)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fakes.gemini_api import FakeGemini
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.server import serve_in_thread, stop_all

GEMINI_KEY = "AIza-test-gemini-key-0123"
OPENAI_KEY = "sk-test-key-0123456789"
MODEL = "gemini-3-pro-preview"


@dataclass
class GeminiSetup:
    """The fakes of one test and the model profiles that use them."""

    gemini: FakeGemini
    openai: FakeOpenAI
    profiles: dict[str, dict[str, Any]]


@pytest.fixture
def gem(monkeypatch: pytest.MonkeyPatch) -> Iterator[GeminiSetup]:
    monkeypatch.setenv("TEST_GEMINI_KEY", GEMINI_KEY)
    monkeypatch.setenv("TEST_OPENAI_KEY", OPENAI_KEY)
    gemini = FakeGemini(api_key=GEMINI_KEY, models={MODEL, "gemini-2.5-flash"})
    oai = FakeOpenAI(api_key=OPENAI_KEY, models={"gpt-5.1"})
    servers = [serve_in_thread(gemini.app), serve_in_thread(oai.app)]
    base = servers[0].url + "/v1beta"
    profiles: dict[str, dict[str, Any]] = {
        "gem": {
            "provider": "gemini",
            "model": MODEL,
            "api_key_env": "TEST_GEMINI_KEY",
            "base_url": base,
            "retry": {"max_attempts": 4, "max_total_s": 10},
        },
        # the same model under a second profile: its own signatures only
        "gem2": {
            "provider": "gemini",
            "model": MODEL,
            "api_key_env": "TEST_GEMINI_KEY",
            "base_url": base,
        },
        "flash": {
            "provider": "gemini",
            "model": "gemini-2.5-flash",
            "api_key_env": "TEST_GEMINI_KEY",
            "base_url": base,
            "thinking": {"mode": "adaptive"},
        },
        "gpt": {
            "provider": "openai",
            "model": "gpt-5.1",
            "api_key_env": "TEST_OPENAI_KEY",
            "base_url": servers[1].url + "/v1",
        },
    }
    try:
        yield GeminiSetup(gemini, oai, profiles)
    finally:
        stop_all(servers)
