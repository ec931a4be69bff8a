"""Epoch milliseconds: one conversion, exact, refusing a naive time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from platform_tasks.epoch import epoch_ms, from_epoch_ms


def test_an_aware_instant_is_whole_milliseconds_since_the_epoch() -> None:
    assert epoch_ms(datetime(1970, 1, 1, tzinfo=UTC)) == 0
    assert epoch_ms(datetime(2026, 12, 7, 6, 0, 0, 123_999, tzinfo=UTC)) == 1796623200123
    paris = timezone(timedelta(hours=1))
    assert epoch_ms(datetime(2026, 12, 7, 7, 0, 0, 123_000, tzinfo=paris)) == 1796623200123


def test_milliseconds_come_back_as_the_same_instant() -> None:
    instant = datetime(2031, 5, 17, 3, 4, 5, 678_000, tzinfo=UTC)
    assert from_epoch_ms(epoch_ms(instant)) == instant
    assert from_epoch_ms(0).tzinfo is UTC


def test_a_naive_instant_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        epoch_ms(datetime(2026, 1, 1))
