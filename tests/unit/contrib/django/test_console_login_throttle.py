"""The login throttle's rule, driven by explicit times: failures count in a window, the
limit-th sets a lock of bounded length, and a passed window starts again from one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from platform_tasks.contrib.django.login_throttle import Count, Policy, after_failure
from platform_tasks.contrib.django.settings_values import positive_int
from platform_tasks.errors import SettingsError

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
POLICY = Policy(failures=3, failures_per_address=10, lockout=timedelta(minutes=15))


def test_the_limit_th_failure_in_a_window_locks_for_the_lockout() -> None:
    count = None
    for minute in range(3):
        count = after_failure(count, T0 + timedelta(minutes=minute), POLICY.failures, POLICY)
    assert count == Count(3, T0, T0 + timedelta(minutes=2) + POLICY.lockout)


def test_failures_below_the_limit_lock_nothing() -> None:
    count = after_failure(None, T0, POLICY.failures, POLICY)
    count = after_failure(count, T0 + timedelta(minutes=14), POLICY.failures, POLICY)
    assert count == Count(2, T0, None)


def test_a_passed_window_starts_again_so_a_lock_never_grows() -> None:
    old = Count(3, T0, T0 + POLICY.lockout)
    later = T0 + POLICY.lockout
    assert after_failure(old, later, POLICY.failures, POLICY) == Count(1, later, None)


@pytest.mark.parametrize(
    "kwargs",
    [{"failures": 0}, {"failures_per_address": 0}, {"lockout": timedelta(0)}],
)
def test_a_policy_without_a_positive_limit_or_lockout_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"at least 1|positive"):
        Policy(**kwargs)  # type: ignore[arg-type]


def test_the_throttle_settings_are_positive_whole_numbers_named_when_bad() -> None:
    assert positive_int("PLATFORM_CONSOLE_LOGIN_FAILURES", None, 5) == 5
    assert positive_int("PLATFORM_CONSOLE_LOGIN_FAILURES", " 7 ", 5) == 7
    for bad in ("0", "-1", "five"):
        with pytest.raises(SettingsError, match="PLATFORM_CONSOLE_LOGIN_FAILURES: must be"):
            positive_int("PLATFORM_CONSOLE_LOGIN_FAILURES", bad, 5)
