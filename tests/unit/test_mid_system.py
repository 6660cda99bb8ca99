"""Golden cases and the cache property of folding system messages after the start into
user turns (policy/mid_system.py), for a template that takes one system message only."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.llama_server.template_checks import renders_mid_system
from boundedcode_gateway.policy.mid_system import fold_system_messages, marked


def sys(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str, calls: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        out["tool_calls"] = [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]
    return out


def tool(text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "c1", "content": text}


def test_nothing_to_fold_is_the_same_list() -> None:
    messages = [sys("Be brief."), user("hi"), assistant("hello"), user("more")]
    assert fold_system_messages(messages) == (messages, 0)
    assert fold_system_messages(messages)[0] is messages


def test_a_system_message_before_a_user_turn_opens_it() -> None:
    messages = [sys("Be brief."), user("hi"), assistant("hello"), sys("Now in French."), user("ok")]
    assert fold_system_messages(messages) == (
        [
            sys("Be brief."),
            user("hi"),
            assistant("hello"),
            user(f"{marked('Now in French.')}\n\nok"),
        ],
        1,
    )


def test_past_the_tool_results_into_the_next_user_turn() -> None:
    messages = [
        user("read it"),
        assistant("", calls=True),
        sys("Mind the budget."),
        tool("file text"),
        user([{"type": "text", "text": "go on"}]),
    ]
    folded, count = fold_system_messages(messages)
    assert count == 1
    assert folded == [
        user("read it"),
        assistant("", calls=True),
        tool("file text"),
        user(
            [
                {"type": "text", "text": marked("Mind the budget.")},
                {"type": "text", "text": "go on"},
            ]
        ),
    ]


def test_after_the_last_user_turn_it_closes_it() -> None:
    messages = [user("hi"), sys("Answer in one word."), sys("Be kind.")]
    assert fold_system_messages(messages) == (
        [user(f"hi\n\n{marked('Answer in one word.')}\n\n{marked('Be kind.')}")],
        2,
    )


def test_after_tool_results_with_no_user_turn_a_user_turn_of_its_own() -> None:
    messages = [user("hi"), assistant("", calls=True), tool("out"), sys("Stop soon.")]
    assert fold_system_messages(messages) == (
        [user("hi"), assistant("", calls=True), tool("out"), user(marked("Stop soon."))],
        1,
    )


def test_system_messages_at_the_start_are_one() -> None:
    messages = [sys("A."), sys("B."), user("hi")]
    assert fold_system_messages(messages) == ([sys("A.\n\nB."), user("hi")], 0)


def test_text_parts_of_a_system_message_are_its_text() -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    messages = [user("hi"), assistant("ok"), {"role": "system", "content": parts}, user("next")]
    assert fold_system_messages(messages)[0][-1] == user(marked("one\ntwo") + "\n\nnext")


_ROLE = st.sampled_from(["user", "system", "tool", "assistant"])


def _conversation(roles: list[str], start: int) -> list[dict[str, Any]]:
    return [{"role": r, "content": f"[{r} {start + i}]"} for i, r in enumerate(roles)]


@given(
    st.lists(_ROLE, min_size=1, max_size=12).filter(lambda r: r[-1] != "assistant"),
    st.lists(st.sampled_from(["user", "system", "tool"]), max_size=5),
)
def test_the_prompt_of_a_turn_starts_the_next_turns(before: list[str], after: list[str]) -> None:
    """Turn N+1 is turn N's request, the model's answer, and what came since: its folded
    messages begin with turn N's folded messages, so the rendered prompt does too."""
    turn = _conversation(before, 0)
    answer = {"role": "assistant", "content": "the answer"}
    following = [*turn, answer, *_conversation(after, len(before) + 1)]
    now, _ = fold_system_messages(turn)
    later, _ = fold_system_messages(following)
    assert later[: len(now)] == now
    # no system message is left after the start, and every one's text is kept once
    assert all(m["role"] != "system" for m in later[1:])
    shown = "".join(str(m["content"]) for m in later)
    for m in following:
        if m["role"] == "system":
            assert shown.count(m["content"]) == 1


def test_the_template_probe_tells_a_system_message_rendered_in_place() -> None:
    in_place = (
        "<|im_start|>system\nprobe-system<|im_end|>\n<|im_start|>user\nprobe-question<|im_end|>\n"
        "<|im_start|>assistant\nprobe-answer<|im_end|>\n<|im_start|>system\nprobe-mid-system"
    )
    assert renders_mid_system(in_place)
    # refused (the template raised), dropped, or moved to the start: not in place
    assert not renders_mid_system(None)
    assert not renders_mid_system(in_place.replace("probe-mid-system", ""))
    assert not renders_mid_system("probe-mid-system\nprobe-question probe-answer")
