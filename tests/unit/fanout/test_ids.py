"""Deterministic fan-out job ids: valid UUIDv7s, time part = the point, stable, distinct."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from platform_tasks.envelope import Envelope
from platform_tasks.fanout.ids import fan_out_job_id, point_ms, tenant_job_id
from tests.support.strategies import tenant_ids

POINT = datetime(2025, 3, 30, 1, 0, tzinfo=UTC)


def _time_ms(value: object) -> int:
    return int(str(value).replace("-", "")[:12], 16)


@given(tenant=tenant_ids, offset=st.integers(min_value=0, max_value=10**12))
def test_tenant_ids_are_uuid7_with_the_point_as_time(tenant: str, offset: int) -> None:
    point = datetime(2000, 1, 1, tzinfo=UTC) + timedelta(milliseconds=offset)
    job_id = tenant_job_id("maintenance.freshness", point, "maintenance.recompute", tenant)
    assert job_id.version == 7
    assert job_id.variant == "specified in RFC 4122"
    assert _time_ms(job_id) == point_ms(point)
    # the envelope model accepts it
    Envelope[dict].model_validate(
        {"job_id": job_id, "tenant_id": tenant, "correlation_id": "c", "kind": "a.b", "data": {}}
    )


def test_ids_are_stable_and_depend_on_every_part() -> None:
    base = tenant_job_id("job.a", POINT, "kind.x", "acme")
    assert base == tenant_job_id("job.a", POINT, "kind.x", "acme")
    others = {
        tenant_job_id("job.b", POINT, "kind.x", "acme"),
        tenant_job_id("job.a", POINT + timedelta(hours=1), "kind.x", "acme"),
        tenant_job_id("job.a", POINT, "kind.y", "acme"),
        tenant_job_id("job.a", POINT, "kind.x", "acme2"),
        fan_out_job_id("job.a", POINT, "kind.x"),
    }
    assert base not in others and len(others) == 5


def test_same_instant_in_another_zone_gives_the_same_id() -> None:
    berlin = POINT.astimezone(timezone(timedelta(hours=2)))
    assert tenant_job_id("j.a", berlin, "k.x", "t") == tenant_job_id("j.a", POINT, "k.x", "t")


def test_ids_of_later_points_sort_after() -> None:
    earlier = [tenant_job_id("j.a", POINT, "k.x", f"t{n}") for n in range(50)]
    later = [
        tenant_job_id("j.a", POINT + timedelta(milliseconds=1), "k.x", f"t{n}") for n in range(50)
    ]
    assert max(earlier) < min(later)


def test_a_naive_point_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        tenant_job_id("j.a", datetime(2025, 1, 1), "k.x", "t")
