"""The chunks the translating adapters write: their time and ids come from the stamps given."""

from __future__ import annotations

import orjson

from boundedcode_gateway.wire.chat import ChunkWriter, Stamps

FIXED = Stamps(clock=lambda: 1_700_000_000.5, random_hex=lambda: "0" * 24)


def test_a_writer_with_fixed_stamps_writes_the_same_bytes_every_time() -> None:
    first = ChunkWriter(None, "m", FIXED).delta({"content": "hi"})
    again = ChunkWriter(None, "m", FIXED).delta({"content": "hi"})
    assert first == again
    chunk = orjson.loads(first)
    assert (chunk["id"], chunk["created"]) == ("chatcmpl-" + "0" * 24, 1_700_000_000)
    assert chunk["choices"][0]["delta"] == {"role": "assistant", "content": "hi"}


def test_the_upstream_answer_id_is_kept() -> None:
    chunk = orjson.loads(ChunkWriter("msg_1", "m", FIXED).delta({}))
    assert chunk["id"] == "chatcmpl-msg_1"
    assert FIXED.tool_call_id() == "call_" + "0" * 24
