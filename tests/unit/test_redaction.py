"""Redaction of the API key: in upstream error fields (before any cut), in errors, and in
the JSON bytes on their way to a caller, however the JSON escapes the key."""

from __future__ import annotations

import orjson
from hypothesis import example, given
from hypothesis import strategies as st

from boundedcode_gateway.errors import (
    UpstreamFailure,
    redact_bytes,
    redact_error,
    secret_forms,
)
from boundedcode_gateway.providers.upstream_errors import (
    FIELD_CHARS,
    TEXT_CHARS,
    error_from_text,
    upstream_error,
)

KEY = 'sk-proj-Zq81/x"b\\c'
# keys are visible ASCII (a key a header cannot carry is refused before it is sent); none
# holds the "*" it is replaced with
keys = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="*"),
    min_size=8,
    max_size=40,
)


def test_every_field_of_an_upstream_error_is_redacted() -> None:
    err = upstream_error(429, f"bad {KEY}", error_type=KEY, code=KEY, param=KEY, secrets=(KEY,))
    assert (err.message, err.type, err.code, err.param) == ("bad ***", "***", "***", "***")


def test_a_text_is_redacted_before_it_is_cut() -> None:
    filler = "e" * (TEXT_CHARS - 5)
    err = error_from_text(400, f"{filler}{KEY} trailing".encode(), (KEY,))
    assert err.message == f"{filler}*** t"
    assert KEY[:5] not in err.message


def test_fields_longer_than_any_code_are_cut() -> None:
    err = upstream_error(400, "x", error_type="t" * 1000, code="c" * 1000, secrets=())
    assert len(err.type) == FIELD_CHARS and err.code == "c" * FIELD_CHARS


def test_an_error_raised_elsewhere_is_redacted_in_place() -> None:
    err = UpstreamFailure(f"said {KEY}", code=KEY, param=KEY, error_type=KEY)
    err.headers["x-echo"] = KEY
    assert redact_error(err, (KEY,)) is err
    assert KEY not in orjson.dumps(err.to_body()).decode() and err.headers == {"x-echo": "***"}
    assert KEY not in str(err)


def test_the_key_as_json_escapes_it_is_found() -> None:
    forms = secret_forms((KEY,))
    escaped = orjson.dumps({"model": KEY, "note": f"({KEY})"})
    slashed = escaped.replace(b"/", b"\\/")
    for raw in (escaped, slashed):
        out = redact_bytes(raw, forms)
        assert orjson.loads(out) == {"model": "***", "note": "(***)"}


@given(key=keys, before=st.text(max_size=20), after=st.text(max_size=20))
# a key of hex digits right after a control character, which JSON writes as \u0010
@example(key="00000000", before="\x10", after="")
def test_redacted_json_stays_json_without_the_key(key: str, before: str, after: str) -> None:
    obj = {"id": "c1", "model": key, "choices": [{"delta": {"content": before + key + after}}]}
    out = redact_bytes(orjson.dumps(obj), secret_forms((key,)))
    parsed = orjson.loads(out)  # still JSON
    assert key not in parsed["model"] and key not in parsed["choices"][0]["delta"]["content"]
