"""The retry policy: Retry-After in its three forms, backoff, and the budget."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from boundedcode_gateway.policy.retry import (
    RetryBudget,
    RetryRules,
    backoff_s,
    decide,
    retry_after_s,
)

CLOUD = RetryRules(
    statuses=frozenset({408, 409, 429, 500, 502, 503, 504, 529}),
    max_attempts=4,
    never_codes=frozenset({"insufficient_quota"}),
)
LOCAL = RetryRules(statuses=frozenset({500}), max_attempts=3)
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def test_retry_after_forms() -> None:
    assert retry_after_s({"retry-after": "2"}) == 2.0
    assert retry_after_s({"retry-after": "0.25"}) == 0.25
    assert retry_after_s({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    date = format_datetime(NOW + timedelta(seconds=30), usegmt=True)
    assert retry_after_s({"retry-after": date}, now=NOW) == 30.0
    past = format_datetime(NOW - timedelta(seconds=30), usegmt=True)
    assert retry_after_s({"retry-after": past}, now=NOW) == 0.0
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({}) is None


def test_backoff_grows_caps_and_jitters_down() -> None:
    rng = random.Random(7)
    for attempt, base in [(1, 0.5), (2, 1.0), (3, 2.0), (5, 8.0), (9, 8.0)]:
        delay = backoff_s(attempt, rng)
        assert 0.75 * base <= delay <= base


def call(
    status: int,
    attempt: int = 1,
    elapsed: float = 0.0,
    code: str | None = None,
    retryable: bool = False,
    headers: dict[str, str] | None = None,
    rules: RetryRules = CLOUD,
    budget: RetryBudget | None = None,
) -> tuple[bool, float]:
    d = decide(
        status=status,
        code=code,
        retryable=retryable,
        headers=headers or {},
        attempt=attempt,
        elapsed_s=elapsed,
        rules=rules,
        budget=budget or RetryBudget(),
        rng=random.Random(1),
    )
    return d.retry, d.delay_s


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529])
def test_cloud_retries(status: int) -> None:
    assert call(status)[0]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
def test_other_4xx_never(status: int) -> None:
    assert call(status) == (False, 0.0)


def test_retry_after_is_honoured() -> None:
    assert call(429, headers={"retry-after": "3"}) == (True, 3.0)


def test_retry_after_beyond_budget_is_not_taken() -> None:
    assert not call(429, headers={"retry-after": "120"})[0]
    assert not call(429, elapsed=58.0, headers={"retry-after": "3"})[0]


def test_attempts_capped_by_rules_and_budget() -> None:
    assert call(500, attempt=2, rules=LOCAL)[0]
    assert not call(500, attempt=3, rules=LOCAL)[0]  # llama.cpp: 3 attempts in all
    assert not call(503, attempt=2, budget=RetryBudget(max_attempts=2))[0]


def test_local_only_500() -> None:
    assert not call(503, rules=LOCAL)[0]
    assert not call(429, rules=LOCAL)[0]


def test_transport_failures_retry_whatever_the_status() -> None:
    assert call(503, retryable=True, rules=LOCAL)[0]
    assert not call(503, retryable=True, attempt=4, rules=LOCAL)[0]


def test_used_up_quota_never() -> None:
    assert not call(429, code="insufficient_quota")[0]


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999", "sk-not-a-number"])
def test_a_retry_after_that_is_no_finite_number_is_none(value: str) -> None:
    assert retry_after_s({"retry-after": value}) is None
    assert retry_after_s({"retry-after-ms": value}) is None
