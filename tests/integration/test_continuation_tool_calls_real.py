"""The pinned llama-server parses a tool call the model writes after a continued text.

The gateway holds tool calls back until the finish, so that a break inside one has
shown only text and the server can go on from it (a message with tool calls cannot
be continued). That works only if the server, continuing a final assistant message
of text, still turns the tool call that follows into ``tool_calls``. SmolLM2 with the
shipped tool template; the continued text ends with the call's opening marker, and
``tool_choice: "required"`` with a one-value enum holds the rest to one call, so the
model writes the same call on every run.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.conftest import run_llama_server

pytestmark = pytest.mark.llama_server

READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file of the project",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "enum": ["README.md"]}},
            "required": ["path"],
        },
    },
}
SHOWN = "I will read README.md.\n"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    yield from run_llama_server(
        Path(str(resources.files("boundedcode_gateway") / "templates" / "smollm2_tools.jinja"))
    )


def test_a_tool_call_after_continued_text_comes_back_as_tool_calls(server: str) -> None:
    body: dict[str, Any] = {
        "messages": [
            {"role": "user", "content": "Read the file README.md"},
            {"role": "assistant", "content": SHOWN + "<tool_call>\n"},
        ],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "tools": [READ_FILE],
        "tool_choice": "required",
        "temperature": 0,
        "seed": 7,
        "max_tokens": 40,
        "stream": True,
    }
    content, arguments, names, finish = "", "", "", None
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = orjson.loads(line[6:]).get("choices") or []
            if not choices:
                continue
            delta = choices[0].get("delta") or {}
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                names += (call.get("function") or {}).get("name") or ""
                arguments += (call.get("function") or {}).get("arguments") or ""
            finish = choices[0].get("finish_reason") or finish
    # only what was generated after the continued text: no text again, the call parsed
    assert content == ""
    assert names == "read_file" and orjson.loads(arguments) == {"path": "README.md"}
    assert finish == "tool_calls"
