"""A fake Anthropic API on 127.0.0.1 and the model profiles that point at it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.server import serve_in_thread

ANTHROPIC_KEY = "sk-ant-test-0123456789"


@dataclass
class Claude:
    """The fake and its profiles: ``claude`` thinks (manual budget), ``haiku`` does not."""

    fake: FakeAnthropic
    url: str

    def profile(self, **extra: Any) -> dict[str, Any]:
        return {
            "provider": "anthropic",
            "model": "claude-sonnet-4-5",
            "base_url": self.url + "/v1",
            "api_key_env": "TEST_ANTHROPIC_KEY",
            **extra,
        }

    @property
    def profiles(self) -> dict[str, dict[str, Any]]:
        return {
            "claude": self.profile(thinking={"budget_tokens": 2048}, max_tokens=8192),
            "haiku": self.profile(model="claude-haiku-4-5"),
        }


@pytest.fixture
def claude(monkeypatch: pytest.MonkeyPatch) -> Iterator[Claude]:
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", ANTHROPIC_KEY)
    fake = FakeAnthropic(api_key=ANTHROPIC_KEY)
    with serve_in_thread(fake.app) as server:
        yield Claude(fake, server.url)
