"""The retry policy, in one place: which failures are sent again, after how long, how often.

Pure: a failure, the attempt number and the time spent in; a decision out.
The adapters supply their kind's rules as data (``RetryRules``); the profile
may narrow the budget.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from boundedcode_gateway.unique_ids import GENERATOR

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 8.0
# failures no resend cures, whatever the upstream kind: the gateway's own way out
# refused, or an answer past the gateway's limits (the same upstream would send it again)
NEVER_RESENT_CODES = frozenset({"proxy_refused", "upstream_response_too_large"})


@dataclass(frozen=True, slots=True)
class RetryRules:
    """Which statuses a kind of upstream answers that are worth sending again."""

    # upstream statuses sent again within the budget (cloud: 408, 409, 429, 5xx, 529)
    statuses: frozenset[int]
    # attempts in all for those statuses (llama.cpp's 500: 3)
    max_attempts: int
    # error codes never resent whatever their status (a used-up quota)
    never_codes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """A profile's limit on resending: attempts in all, and seconds from the first send."""

    max_attempts: int = 4
    max_total_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Decision:
    retry: bool
    delay_s: float = 0.0


NO_RETRY = Decision(False)


def _seconds(text: str, scale: float = 1.0) -> float | None:
    """A finite number of seconds (never negative), or None for anything else."""
    try:
        value = float(text) / scale
    except ValueError:
        return None
    return max(value, 0.0) if math.isfinite(value) else None


def retry_after_s(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """The server's wish, from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms is not None and (wait := _seconds(ms, 1000.0)) is not None:
        return wait
    value = headers.get("retry-after")
    if value is None:
        return None
    if (wait := _seconds(value)) is not None:
        return wait
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


def backoff_s(attempt: int, rng: random.Random | None = None) -> float:
    """Exponential backoff after ``attempt`` failed sends, with up to 25 % jitter off."""
    base: float = min(BACKOFF_BASE_S * 2.0 ** (attempt - 1), BACKOFF_CAP_S)
    jitter: float = (rng or GENERATOR).random()
    return base * (1.0 - 0.25 * jitter)


def decide(
    *,
    status: int,
    code: str | None,
    retryable: bool,
    headers: Mapping[str, str],
    attempt: int,
    elapsed_s: float,
    rules: RetryRules,
    budget: RetryBudget,
    rng: random.Random | None = None,
) -> Decision:
    """Whether attempt ``attempt`` (1-based) that failed with ``status`` is sent again.

    ``retryable`` marks failures of the transport (refused or reset connections),
    which are resent whatever the status rules say. The budget caps both: a delay
    that would end past ``max_total_s`` (a long Retry-After included) is not taken.
    """
    if not (retryable or status in rules.statuses):
        return NO_RETRY
    if code in rules.never_codes or code in NEVER_RESENT_CODES:
        return NO_RETRY
    limit = min(budget.max_attempts, rules.max_attempts) if not retryable else budget.max_attempts
    if attempt >= limit:
        return NO_RETRY
    wished = retry_after_s(headers)
    delay = wished if wished is not None else backoff_s(attempt, rng)
    if elapsed_s + delay > budget.max_total_s:
        return NO_RETRY
    return Decision(True, delay)
