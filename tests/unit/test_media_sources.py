"""Which media sources are inline data and which are places a server would fetch from."""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.policy.media import is_inline, media_parts

MEDIA_TYPES = st.sampled_from(["image/png", "image/jpeg", "audio/wav", "video/mp4"])
SCHEMES = st.from_regex(r"[A-Za-z][A-Za-z0-9+.-]{0,9}", fullmatch=True).filter(
    lambda s: s.lower() != "data"
)


@given(st.binary(max_size=256), MEDIA_TYPES)
def test_encoded_bytes_are_inline(data: bytes, media_type: str) -> None:
    encoded = base64.b64encode(data).decode()
    assert is_inline(f"data:{media_type};base64,{encoded}")
    # bare base64 (OpenAI's input_audio.data), unless it begins as llama-server's
    # test for a download does
    assert is_inline(encoded) is (not encoded.lower().startswith("http"))


@given(SCHEMES, st.text(max_size=40))
def test_a_source_with_any_other_scheme_is_fetched(scheme: str, rest: str) -> None:
    assert not is_inline(f"{scheme}:{rest}")


@given(st.sampled_from(["http", "HTTP", "Http", "hTtP"]), st.text(max_size=40))
def test_anything_that_begins_with_http_is_fetched(prefix: str, rest: str) -> None:
    assert not is_inline(prefix + rest)


def test_media_parts_are_found_where_they_are_with_each_source() -> None:
    messages: list[Any] = [
        {"role": "system", "content": "plain"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi"},
                {"type": "image_url", "image_url": {"url": "https://a/x.png"}},
                {"type": "input_audio", "input_audio": {"data": "UklGR", "format": "wav"}},
                {"type": "video_url", "video_url": "https://a/v.mp4"},
                {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBE"}},
                "not a part",
            ],
        },
    ]
    parts = list(media_parts(messages))
    assert [(p.kind, p.where) for p in parts] == [
        ("image", "messages[1].content[1]"),
        ("audio", "messages[1].content[2]"),
        ("video", "messages[1].content[3]"),
        ("file", "messages[1].content[4]"),
    ]
    assert [p.remote_source() for p in parts] == [
        ("url", "https://a/x.png"),
        None,
        ("", "https://a/v.mp4"),
        None,
    ]
