"""What a call cost: a profile's ``price:`` applied to the call's tokens and server time.

A pure function; the meter applies it once, when the call's record is finalised. The
price is handed in as a value (``config.PriceSettings`` is one): metering does not read
the configuration.
"""

from __future__ import annotations

from typing import Protocol

PER_MTOK = 1_000_000
MS_PER_S = 1000.0
# nano-dollars: below any price's precision, and sums of costs stay free of float noise
DIGITS = 9


class Price(Protocol):
    """A profile's prices in USD: per million tokens, and per second of a local server's work."""

    @property
    def input_per_mtok(self) -> float: ...

    @property
    def cached_input_per_mtok(self) -> float | None: ...

    @property
    def output_per_mtok(self) -> float: ...

    @property
    def gpu_second(self) -> float | None: ...


def call_cost(
    price: Price | None,
    *,
    prompt_tokens: int | None,
    cached_tokens: int | None,
    completion_tokens: int | None,
    prefill_ms: float | None = None,
    decode_ms: float | None = None,
) -> float | None:
    """The call's cost in USD; None without a price, or when the upstream reported no usage.

    Prompt tokens served from the cache are charged at ``cached_input_per_mtok`` (the
    input price when unset), the rest at ``input_per_mtok``; completion tokens, reasoning
    included as providers bill it, at ``output_per_mtok``; a local server's prefill and
    decode time at ``gpu_second``.
    """
    if price is None or (prompt_tokens is None and completion_tokens is None):
        return None
    prompt = max(0, prompt_tokens or 0)
    # an upstream that reports more cached than prompt tokens is not trusted for the excess
    cached = min(prompt, max(0, cached_tokens or 0))
    completion = max(0, completion_tokens or 0)
    cached_price = price.input_per_mtok
    if price.cached_input_per_mtok is not None:
        cached_price = price.cached_input_per_mtok
    cost = (
        (prompt - cached) * price.input_per_mtok
        + cached * cached_price
        + completion * price.output_per_mtok
    ) / PER_MTOK
    if price.gpu_second is not None and (prefill_ms is not None or decode_ms is not None):
        busy_ms = max(0.0, prefill_ms or 0.0) + max(0.0, decode_ms or 0.0)
        cost += price.gpu_second * busy_ms / MS_PER_S
    return round(cost, DIGITS)
