"""Which freshness tiers are due: UTC hours that are multiples of the tier's period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from platform_tasks.fanout.tiers import TIERS, due_tiers, is_due


def test_tiers_over_one_utc_day() -> None:
    day = datetime(2025, 6, 1, tzinfo=UTC)
    counts = dict.fromkeys(TIERS, 0)
    due_hours: dict[str, list[int]] = {tier: [] for tier in TIERS}
    for hour in range(24):
        for tier in due_tiers(day + timedelta(hours=hour, minutes=7)):
            counts[tier] += 1
            due_hours[tier].append(hour)
    assert counts == {"1h": 24, "3h": 8, "6h": 4, "12h": 2, "nightly": 1}
    assert due_hours["12h"] == [0, 12]
    assert due_hours["6h"] == [0, 6, 12, 18]
    assert due_hours["nightly"] == [0]


def test_hours_are_utc_whatever_the_zone_of_the_point() -> None:
    # 02:00 in Berlin (summer) is 00:00 UTC: every tier is due.
    berlin = datetime(2025, 7, 1, 2, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    assert due_tiers(berlin) == TIERS
    # 00:00 in New York is 04:00 or 05:00 UTC: never nightly.
    assert not is_due("nightly", datetime(2025, 7, 1, tzinfo=ZoneInfo("America/New_York")))


def test_unknown_tier_and_naive_point_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown freshness tier 'weekly'"):
        is_due("weekly", datetime(2025, 1, 1, tzinfo=UTC))
    with pytest.raises(ValueError, match="timezone-aware"):
        is_due("1h", datetime(2025, 1, 1))
