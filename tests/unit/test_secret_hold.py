"""A key split across a stream's deltas: the scan's property (any split of any text
releases what redacting the whole gives), and the translator that holds back the end of a
delta that may begin a key, around the tool-call hold, through a finish and a break."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.errors import redact
from boundedcode_gateway.providers.base import PartialAnswer, RequestOptions
from boundedcode_gateway.providers.openai_compat.stream import OpenAIStreamTranslator
from boundedcode_gateway.secret_hold import SecretHold, TextHold
from boundedcode_gateway.tool_call_hold import ToolCallHold

KEY = "sk-SPLIT-7c1e9a40"
STREAMED = RequestOptions(stream=True, include_usage=True, return_progress=False)
HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 100, "model": "m"}

# few letters, so that keys, their beginnings and their overlaps are common
LETTERS = st.text(alphabet="abk-*", max_size=40)
SECRETS = st.lists(st.text(alphabet="abk-*", min_size=1, max_size=6), min_size=1, max_size=3)


def splits(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def streamed(hold: TextHold, pieces: list[str]) -> str:
    return "".join(hold.feed(p) for p in pieces) + hold.finish()


@given(LETTERS, SECRETS, st.lists(st.integers(min_value=0), max_size=12))
def test_any_split_of_any_text_releases_the_whole_texts_redaction(
    text: str, secrets: list[str], cuts: list[int]
) -> None:
    hold = TextHold(tuple(secrets))
    assert streamed(hold, splits(text, cuts)) == hold.whole(text)
    assert hold.held == ""


@given(st.text(max_size=60), st.lists(st.integers(min_value=0), max_size=12))
def test_for_one_key_the_scan_is_the_gateways_redaction(text: str, cuts: list[int]) -> None:
    whole = text[: len(text) // 2] + KEY + text[len(text) // 2 :]
    hold = TextHold((KEY,))
    assert streamed(hold, splits(whole, cuts)) == redact(whole, (KEY,))
    assert KEY not in streamed(TextHold((KEY,)), splits(whole, cuts))


def test_only_an_end_that_may_begin_a_key_is_held() -> None:
    hold = TextHold((KEY,))
    assert hold.feed("your key is sk-SP") == "your key is "
    assert hold.held == "sk-SP"
    assert hold.feed("LIT-7c1e9a40 and more s") == "*** and more "
    assert hold.feed("o on") == "so on"  # "so" begins no key: let go with what follows
    assert hold.feed("ask") == "a"  # "sk" may begin one
    assert hold.feed(" me") == "sk me"
    assert hold.held == "" and hold.finish() == ""
    assert hold.feed("no s") == "no " and hold.finish() == "s"


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return orjson.dumps({**HEAD, "choices": [choice]})


def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return chunk(delta, finish)


def held(keep_shown: bool = False) -> SecretHold:
    inner = OpenAIStreamTranslator(STREAMED, keep_shown=keep_shown)
    return SecretHold(ToolCallHold(inner), (KEY,))


def fed(t: SecretHold, *events: bytes) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for data in events:
        out += [orjson.loads(p) for p in t.feed("", data)]
    return out


def texts(out: list[dict[str, Any]], key: str = "content") -> str:
    return "".join(c["choices"][0]["delta"].get(key) or "" for c in out if c.get("choices"))


def test_a_key_across_two_content_deltas_is_replaced_whole() -> None:
    t = held()
    first = fed(t, event({"role": "assistant", "content": ""}), event({"content": "key: sk-SPL"}))
    assert texts(first) == "key: "
    rest = fed(t, event({"content": "IT-7c1e9a40!"}), event({}, "stop"))
    assert texts(first + rest) == "key: ***!"
    assert rest[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_key_across_three_reasoning_deltas_is_replaced_whole() -> None:
    t = held()
    pieces = ["I saw sk-S", "PLIT-7c", "1e9a40 there"]
    out = fed(t, *(event({"reasoning_content": p}) for p in pieces), event({}, "stop"))
    assert texts(out, "reasoning_content") == "I saw *** there"


def test_what_is_held_at_the_finish_goes_out_before_the_finish_and_the_calls() -> None:
    t = held()
    call = {"index": 0, "id": "call_1", "type": "function"}
    call["function"] = {"name": "read", "arguments": "{}"}
    out = fed(
        t,
        event({"role": "assistant", "content": "ends with sk-SPLIT"}),
        event({"tool_calls": [call]}),
        event({}, "tool_calls"),
    )
    kinds = [next(iter(c["choices"][0]["delta"]), "finish") for c in out]
    assert kinds == ["role", "content", "tool_calls", "finish"]
    assert texts(out) == "ends with sk-SPLIT"  # the text ended: it was no key
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_finish_chunk_that_carries_the_rest_of_the_key() -> None:
    t = held()
    out = fed(t, event({"content": "sk-SPLIT-"}), event({"content": "7c1e9a40"}, "stop"))
    assert texts(out) == "***"
    assert out[-1]["choices"][0]["finish_reason"] == "stop"


def test_an_end_without_a_finish_chunk_lets_the_held_text_go() -> None:
    t = held()
    out = fed(t, event({"content": "almost sk-"}), b"[DONE]")
    assert texts(out) == "almost sk-"
    assert {k: out[-1][k] for k in HEAD} == HEAD


def test_what_the_caller_was_shown_leaves_out_what_is_held() -> None:
    t = held(keep_shown=True)
    fed(t, event({"role": "assistant", "content": "so far sk-SP"}))
    assert t.shown_text() == PartialAnswer("so far ", "", "chatcmpl-1", 100, deltas=1)
    t = held(keep_shown=True)
    fed(t, event({"content": "sk-S"}))
    assert t.shown_text() is None


def test_a_chunk_with_no_text_passes_untouched() -> None:
    t = SecretHold(ToolCallHold(OpenAIStreamTranslator(STREAMED)), (KEY,))
    usage = orjson.dumps({**HEAD, "choices": [], "usage": {"prompt_tokens": 3}})
    assert list(t.feed("", usage)) == [usage]
    plain = chunk({"role": "assistant", "content": "nothing to hide"})
    assert list(t.feed("", plain)) == [plain]
