"""Pure rules of the consumer: backoff bounds, rationale, attempt accounting, verdicts."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from platform_tasks.consumer.attempts import attempt_number, delivery_ttl_seconds
from platform_tasks.consumer.retry import (
    EXHAUSTED,
    PERMANENT,
    RETRY,
    RetryPolicy,
    compute_backoff,
    decide,
    resolve_policies,
)
from platform_tasks.dead_letters.records import raw_payload
from platform_tasks.errors import ConfigurationError, PermanentError

policies = st.builds(
    lambda attempts, base, extra: RetryPolicy(
        max_attempts=attempts,
        base=timedelta(seconds=base),
        cap=timedelta(seconds=base + extra),
        rationale="property test",
    ),
    st.integers(1, 20),
    st.floats(0.001, 3600),
    st.floats(0, 86400),
)


@given(policies, st.integers(1, 200), st.integers(0, 2**32))
def test_backoff_lies_in_half_to_full_nominal_delay(policy: RetryPolicy, n: int, seed: int) -> None:
    d = min(policy.cap.total_seconds(), policy.base.total_seconds() * 2 ** min(n - 1, 62))
    delay = compute_backoff(policy, n, random.Random(seed)).total_seconds()
    assert d / 2 <= delay <= d
    assert delay > 0


def test_default_policy_delays_match_the_documented_formula() -> None:
    policy = RetryPolicy()
    assert [policy.nominal_delay(n).total_seconds() for n in (1, 2, 3, 4)] == [30, 60, 120, 240]
    assert policy.nominal_delay(20) == timedelta(hours=1)


def test_non_default_policy_without_rationale_is_a_startup_error() -> None:
    with pytest.raises(ConfigurationError, match=r"'billing'.*rationale"):
        resolve_policies({"billing": RetryPolicy(max_attempts=2)})
    assert resolve_policies({"billing": RetryPolicy(max_attempts=2, rationale="cheap retries")})
    assert resolve_policies({"plain": RetryPolicy()})


@given(st.integers(1, 10), st.integers(0, 20))
def test_attempt_is_the_header_or_one_past_the_spent_attempts(header: int, spent: int) -> None:
    assert attempt_number(header, spent) == max(header, spent + 1)


def test_a_crash_looping_first_attempt_passes_the_budget_on_its_budget_th_redelivery() -> None:
    policy = RetryPolicy(max_attempts=3, rationale="test")
    attempts = [attempt_number(1, redeliveries) for redeliveries in range(4)]
    assert attempts == [1, 2, 3, 4]
    assert [a > policy.max_attempts for a in attempts] == [False, False, False, True]


@pytest.mark.parametrize("header", [None, "x", "", 0, -3])
def test_unreadable_or_missing_header_counts_as_first_attempt(header: object) -> None:
    assert attempt_number(header, 0) == 1


def test_job_runs_at_most_max_attempts_times() -> None:
    policy = RetryPolicy(max_attempts=4, rationale="test")
    verdicts = [decide(policy, n, RuntimeError("x")).reason for n in range(1, 5)]
    assert verdicts == [RETRY, RETRY, RETRY, EXHAUSTED]


def test_permanent_errors_skip_retries() -> None:
    policy = RetryPolicy()
    assert decide(policy, 1, PermanentError("no")).reason == PERMANENT
    assert decide(policy, 1, KeyError("k"), (LookupError,)).reason == PERMANENT
    assert decide(policy, 1, KeyError("k"), (ValueError,)).reason == RETRY


def test_delivery_count_outlives_the_longest_retry_sequence() -> None:
    policy = RetryPolicy()
    assert delivery_ttl_seconds(policy, 300) >= 5 * (3600 + 300)


def test_raw_payload_keeps_text_or_base64() -> None:
    assert raw_payload(b"hello", "text/plain", {"a": 1})["raw"] == "hello"
    binary = raw_payload(b"\xff\xfe\x00", "application/octet-stream", None)
    assert binary["raw"] == "//4A" and binary["raw_encoding"] == "base64"
    assert binary["headers"] == {}
