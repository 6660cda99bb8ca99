"""Thought signatures: the stored shape, where each goes back, and the placeholder's scope."""

from __future__ import annotations

from typing import Any

import pytest

from boundedcode_gateway.providers.gemini.signatures import (
    PLACEHOLDER,
    TEXT_SLOT,
    SignatureCollector,
    TurnSignatures,
    add_placeholders,
    apply_to_parts,
)


def test_stored_shape_round_trips() -> None:
    sigs = TurnSignatures({2: "c", TEXT_SLOT: "t", 0: "a"}, native_ids=True)
    data = sigs.to_data()
    assert data == {"slots": [[-1, "t"], [0, "a"], [2, "c"]], "ids": True}
    assert TurnSignatures.from_data(data) == sigs


@pytest.mark.parametrize("data", [None, "text", {"slots": "x"}, {}])
def test_what_this_version_did_not_write_is_ignored(data: Any) -> None:
    assert TurnSignatures.from_data(data) is None


def test_bad_entries_are_skipped() -> None:
    data = {"slots": [[0, "a"], ["1", "b"], [2], [3, 4]]}
    assert TurnSignatures.from_data(data) == TurnSignatures({0: "a"})


def test_collector_keeps_the_last_text_signature_and_each_call() -> None:
    c = SignatureCollector()
    c.add("first", None)
    c.add("", None)
    c.add(None, 1)
    c.add("call0", 0)
    c.add("last", None)
    captured = c.captured(["id0"], "hello", False)
    assert captured is not None
    assert captured.data == {"slots": [[-1, "last"], [0, "call0"]], "ids": False}
    assert SignatureCollector().captured([], "x", False) is None


def test_apply_to_parts_skips_slots_the_turn_lacks() -> None:
    parts: list[dict[str, Any]] = [{"functionCall": {"name": "a", "args": {}}}]
    apply_to_parts(parts, TurnSignatures({0: "A", 3: "D", TEXT_SLOT: "T"}))
    assert parts == [{"functionCall": {"name": "a", "args": {}}, "thoughtSignature": "A"}]


def content(role: str, *kinds: str) -> dict[str, Any]:
    parts: dict[str, dict[str, Any]] = {
        "text": {"text": "x"},
        "call": {"functionCall": {"name": "f", "args": {}}},
        "result": {"functionResponse": {"name": "f", "response": {}}},
    }
    return {"role": role, "parts": [dict(parts[k]) for k in kinds]}


def test_placeholder_scope_is_the_current_turn() -> None:
    contents = [
        content("user", "text"),
        content("model", "call"),
        content("user", "result"),
        content("model", "text"),
        content("user", "text"),
        content("model", "text", "call", "call"),
        content("user", "result", "result"),
        content("model", "call"),
        content("user", "result"),
    ]
    contents[7]["parts"][0]["thoughtSignature"] = "real"
    assert add_placeholders(contents) == 1
    assert "thoughtSignature" not in contents[1]["parts"][0]
    assert contents[5]["parts"][1]["thoughtSignature"] == PLACEHOLDER
    assert "thoughtSignature" not in contents[5]["parts"][2]
    assert contents[7]["parts"][0]["thoughtSignature"] == "real"


def test_without_a_user_text_every_step_is_current() -> None:
    contents = [content("model", "call"), content("user", "result")]
    assert add_placeholders(contents) == 1
