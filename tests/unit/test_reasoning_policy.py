"""Which reasoning goes where: rules per target kind, and a provenance property."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from boundedcode_gateway.policy.reasoning import StoredReasoning, outgoing_messages
from boundedcode_gateway.reasoning_store.keys import keys_for, message_keys

USER = {"role": "user", "content": "fix it"}
TOOL = {"role": "tool", "tool_call_id": "call_1", "content": "ok", "reasoning_content": "x"}


def store(entries: dict[str, tuple[str, str]]) -> Any:
    def lookup(keys: Sequence[str]) -> StoredReasoning | None:
        for key in keys:
            if key in entries:
                return StoredReasoning(*entries[key])
        return None

    return lookup


def answer(text: str, *ids: str, reasoning: str | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if ids:
        msg["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
        ]
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    return msg


def test_bounded_mode_turn_gets_its_reasoning_back() -> None:
    turn = answer("Done.")
    lookup = store({message_keys([USER, turn], 1)[0]: ("local", "I reasoned.")})
    out = outgoing_messages([USER, turn], True, profile="local", lookup=lookup)
    assert out[1] == {**turn, "reasoning_content": "I reasoned."}
    assert "reasoning_content" not in turn  # the caller's message is not changed


def test_tool_call_turn_is_found_by_its_ids() -> None:
    turn = answer("", "call_1", "call_2")
    lookup = store({"tool:call_2": ("local", "two tools")})
    assert (
        outgoing_messages([turn], True, profile="local", lookup=lookup)[0]["reasoning_content"]
        == "two tools"
    )


def test_absent_stays_absent_and_empty_stays_empty() -> None:
    absent, empty = answer("a"), answer("b", reasoning="")
    out = outgoing_messages([absent, empty], True, profile="local", lookup=store({}))
    assert "reasoning_content" not in out[0]
    assert out[1]["reasoning_content"] == ""


def test_direct_mode_copy_is_kept() -> None:
    turn = answer("a", reasoning="my own copy")
    lookup = store({message_keys([turn], 0)[0]: ("local", "stored")})
    assert outgoing_messages([turn], True, profile="local", lookup=lookup)[0] is turn


def test_another_profiles_reasoning_is_removed() -> None:
    turn = answer("a", reasoning="written by qwen")
    lookup = store({message_keys([turn], 0)[0]: ("qwen", "written by qwen")})
    out = outgoing_messages([turn], True, profile="local", lookup=lookup)
    assert "reasoning_content" not in out[0]
    # and never restored to a profile that did not write it
    bare = answer("a")
    assert (
        "reasoning_content"
        not in outgoing_messages([bare], True, profile="local", lookup=lookup)[0]
    )


def test_non_takers_and_user_and_tool_messages_never_carry_it() -> None:
    turn = answer("a", reasoning="r")
    user = {**USER, "reasoning_content": "no"}
    out = outgoing_messages([user, turn, TOOL], False)
    assert all("reasoning_content" not in m for m in out)
    out = outgoing_messages([user, turn, TOOL], True, profile="p")
    assert "reasoning_content" not in out[0] and "reasoning_content" not in out[2]


def test_keep_puts_it_on_every_tool_turn() -> None:
    tool_turn, plain = answer("", "call_9"), answer("text only")
    out = outgoing_messages(
        [tool_turn, plain], True, profile="ds", lookup=store({}), required_on_tool_turns=True
    )
    assert out[0]["reasoning_content"] == ""
    assert "reasoning_content" not in out[1]


def test_nothing_to_change_returns_the_same_list() -> None:
    msgs = [USER, answer("a")]
    assert outgoing_messages(msgs, True, profile="p", lookup=store({})) is msgs


def test_text_keys_ignore_surrounding_whitespace() -> None:
    assert keys_for([], "  Done.\n", "q ") == keys_for([], "Done.", "q")
    assert keys_for(["call_1"], "x", "q") == ["tool:call_1"]


def test_same_answer_to_different_questions_has_different_keys() -> None:
    assert keys_for([], "OK.", "first question") != keys_for([], "OK.", "second question")


# -- the property: nothing crosses providers or profiles

PROFILES = {"llama-a": "local", "llama-b": "local", "gpt": "openai", "glm": "openai-compatible"}

turns = st.lists(
    st.tuples(
        st.sampled_from(sorted(PROFILES)),  # who wrote the turn
        st.text(min_size=1, max_size=12),  # its text
        st.booleans(),  # with a tool call
        st.sampled_from(["kept", "dropped", "empty"]),  # what the caller sent back
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(turns=turns, target=st.sampled_from(sorted(PROFILES)), takes=st.booleans())
def test_no_reasoning_crosses_profiles(
    turns: list[tuple[str, str, bool, str]], target: str, takes: bool
) -> None:
    entries: dict[str, tuple[str, str]] = {}
    history: list[dict[str, Any]] = []
    written: dict[int, tuple[str, str]] = {}
    for i, (writer, text, tool, sent) in enumerate(turns):
        reasoning = f"reasoning {i} by {writer}"
        ids = (f"call_{i}",) if tool else ()
        msg = answer(text, *ids)
        history += [{"role": "user", "content": f"q{i}", "reasoning_content": "never"}, msg]
        for key in message_keys(history, len(history) - 1):
            entries[key] = (writer, reasoning)
        if sent == "kept":
            msg["reasoning_content"] = reasoning
        elif sent == "empty":
            msg["reasoning_content"] = ""
        written[len(history) - 1] = (writer, reasoning)
    out = outgoing_messages(history, takes, profile=target, lookup=store(entries))
    for j, msg in enumerate(out):
        if msg["role"] != "assistant":
            assert "reasoning_content" not in msg
            continue
        writer, reasoning = written[j]
        if not takes or writer != target:
            assert "reasoning_content" not in msg
        elif history[j].get("reasoning_content") == "":
            assert msg["reasoning_content"] == ""
        else:
            assert msg["reasoning_content"] == reasoning  # byte for byte
