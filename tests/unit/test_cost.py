"""``metering/cost.py``: a profile's price applied to a call's tokens and server time, and
the meter that applies it once per record."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.call_context import CallContext
from boundedcode_gateway.config import PriceSettings
from boundedcode_gateway.errors import UpstreamTimeout
from boundedcode_gateway.metering.cost import call_cost
from boundedcode_gateway.metering.meter import Meter
from tests.unit.scripted_http import RecordingWriter

GPT = PriceSettings(input_per_mtok=1.25, cached_input_per_mtok=0.125, output_per_mtok=10.0)
NO_CACHE_PRICE = PriceSettings(input_per_mtok=3.0, output_per_mtok=15.0)
LOCAL = PriceSettings(input_per_mtok=0.0, output_per_mtok=0.0, gpu_second=0.0005)
BOTH = PriceSettings(input_per_mtok=2.0, output_per_mtok=8.0, gpu_second=0.001)


def cost(price: PriceSettings | None, **usage: Any) -> float | None:
    fields = {"prompt_tokens": None, "cached_tokens": None, "completion_tokens": None, **usage}
    return call_cost(price, **fields)


@pytest.mark.parametrize(
    ("price", "usage", "expected"),
    [
        # 200k uncached at 1.25, 800k cached at 0.125, 50k out at 10
        (GPT, {"prompt_tokens": 1_000_000, "cached_tokens": 800_000, "completion_tokens": 50_000},
         0.25 + 0.1 + 0.5),
        (GPT, {"prompt_tokens": 1000, "cached_tokens": 0, "completion_tokens": 100},
         0.00125 + 0.001),
        # no cached price: cached tokens at the input price
        (NO_CACHE_PRICE, {"prompt_tokens": 2000, "cached_tokens": 1500, "completion_tokens": 10},
         0.006 + 0.00015),
        # cached unknown: all of the prompt is input
        (GPT, {"prompt_tokens": 1000, "completion_tokens": 0}, 0.00125),
        # completion only (prompt not reported)
        (GPT, {"completion_tokens": 1000}, 0.01),
        # a local server's time: 1.5 s of prefill and decode at 0.0005 per second
        (LOCAL, {"prompt_tokens": 900, "cached_tokens": 0, "completion_tokens": 90,
                 "prefill_ms": 500.0, "decode_ms": 1000.0}, 0.00075),
        # tokens and time together; decode time alone
        (BOTH, {"prompt_tokens": 1000, "completion_tokens": 1000, "decode_ms": 2000.0},
         0.002 + 0.008 + 0.002),
        # gpu_second set but no time reported: tokens only
        (BOTH, {"prompt_tokens": 500_000, "completion_tokens": 0}, 1.0),
        # more cached than prompt tokens: never below nothing for the prompt
        (GPT, {"prompt_tokens": 100, "cached_tokens": 400, "completion_tokens": 0}, 0.0000125),
        # the upstream reported zero usage: it cost nothing, and that is known
        (GPT, {"prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0}, 0.0),
    ],
)  # fmt: skip
def test_golden_costs(price: PriceSettings, usage: dict[str, Any], expected: float) -> None:
    assert cost(price, **usage) == pytest.approx(expected, abs=1e-12)


def test_no_price_is_no_cost_never_a_default() -> None:
    assert cost(None, prompt_tokens=1000, cached_tokens=10, completion_tokens=100) is None


def test_no_usage_reported_is_unknown_not_free() -> None:
    assert cost(GPT) is None
    assert cost(LOCAL, prefill_ms=100.0, decode_ms=100.0) is None


def test_cost_is_rounded_to_nano_dollars() -> None:
    # 1 token at 0.1 per million is 1e-7; three of them would be 3.0000000000000004e-07
    price = PriceSettings(input_per_mtok=0.1, output_per_mtok=0.1)
    assert cost(price, prompt_tokens=3, completion_tokens=0) == 3e-07


counts = st.integers(min_value=0, max_value=10**9)
ms = st.none() | st.floats(min_value=0, max_value=1e7, allow_nan=False)
rates = st.floats(min_value=0, max_value=1000, allow_nan=False)
prices = st.builds(
    PriceSettings,
    input_per_mtok=rates,
    cached_input_per_mtok=st.none() | rates,
    output_per_mtok=rates,
    gpu_second=st.none() | st.floats(min_value=0, max_value=10, allow_nan=False),
)


@given(prices, counts, counts, counts, ms, ms)
def test_never_negative(
    price: PriceSettings,
    prompt: int,
    cached: int,
    completion: int,
    prefill: float | None,
    decode: float | None,
) -> None:
    value = call_cost(
        price,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        prefill_ms=prefill,
        decode_ms=decode,
    )
    assert value is not None and value >= 0


@given(prices, counts, counts, counts, st.integers(min_value=1, max_value=10**6), ms)
def test_monotone_in_each_count(
    price: PriceSettings, uncached: int, cached: int, completion: int, more: int, time: float | None
) -> None:
    def at(uncached: int, cached: int, completion: int, decode: float | None) -> float:
        value = call_cost(
            price,
            prompt_tokens=uncached + cached,
            cached_tokens=cached,
            completion_tokens=completion,
            decode_ms=decode,
        )
        assert value is not None
        return value

    base = at(uncached, cached, completion, time)
    assert at(uncached + more, cached, completion, time) >= base
    assert at(uncached, cached + more, completion, time) >= base
    assert at(uncached, cached, completion + more, time) >= base
    assert at(uncached, cached, completion, (time or 0.0) + more) >= base


@given(counts, counts, counts)
def test_a_cheaper_cached_price_never_costs_more(prompt: int, cached: int, completion: int) -> None:
    with_cache = cost(GPT, prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion)
    at_input = cost(
        GPT.model_copy(update={"cached_input_per_mtok": None}),
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
    )
    assert with_cache is not None and at_input is not None
    assert with_cache <= at_input


def test_the_meter_prices_the_finished_record_once() -> None:
    writer = RecordingWriter()
    meter = Meter(writer, CallContext.new("t", "agent_turn"), "gpt", price=GPT)
    r = meter.record
    r.prompt_tokens, r.cached_tokens, r.completion_tokens = 1000, 800, 50
    meter.ok()
    meter.ok()  # a second outcome is ignored: one record
    [record] = writer.records
    assert record.cost_usd == pytest.approx((200 * 1.25 + 800 * 0.125 + 50 * 10.0) / 1e6)


def test_the_meter_leaves_an_unpriced_or_unanswered_call_without_cost() -> None:
    writer = RecordingWriter()
    unpriced = Meter(writer, CallContext.new("t", "agent_turn"), "free")
    unpriced.record.prompt_tokens, unpriced.record.completion_tokens = 10, 10
    unpriced.ok()
    Meter(writer, CallContext.new("t", "agent_turn"), "gpt", price=GPT).error(
        UpstreamTimeout("no answer")
    )
    assert [r.cost_usd for r in writer.records] == [None, None]
