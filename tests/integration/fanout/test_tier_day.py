"""Tier selection over simulated days, driven by explicit ticks of ``JobTestScheduler``.

The job files call ``fan_out(..., tiers="due")``; each tick runs the admitted handler
inline, and the test then runs the fan-out job it handed over (the consumer's code, in
this process) and reads which tenants' envelopes reached the queue.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import psycopg2
import redis

from platform_tasks.fanout.tiers import due_tiers
from platform_tasks.testing import JobTestScheduler

from .conftest import FanOutHarness, add_tenants, queued

JOB = """
from datetime import timedelta
from platform_tasks.fanout import fan_out
from platform_tasks.jobs import define_job

def run(ctx):
    fan_out(ctx, queue="freshness", kind="demo.recompute_freshness", tiers="due")

job = define_job(handler=run, {schedule})
"""

TENANTS = [
    ("t-1h", "1h"),
    ("t-3h", "3h"),
    ("t-6h", "6h"),
    ("t-12h", "12h"),
    ("t-nightly", "nightly"),
    ("t-moves", "nightly"),
]


def write_job(folder: Path, name: str, schedule: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(JOB.format(schedule=schedule)))
    return folder


def drive_hours(
    scheduler: JobTestScheduler,
    harness: FanOutHarness,
    start: datetime,
    hours: int,
    client: redis.Redis,
    *,
    before_hour: dict[int, object] | None = None,
) -> dict[datetime, list[str]]:
    """Tick once a minute past each UTC hour; the tenants published per point."""
    selected: dict[datetime, list[str]] = {}
    for hour in range(hours):
        action = (before_hour or {}).get(hour)
        if callable(action):
            action()
        results = scheduler.tick(at=start + timedelta(hours=hour, minutes=1))
        for result in results:
            if result.outcome == "skipped_duplicate" and result.point in selected:
                continue  # a tick in an hour without a new point reconsiders the last one
            assert (result.outcome, result.run) == ("admitted", "succeeded"), result
            harness.run_pending()
            envelopes = queued(client, "freshness")
            client.delete("freshness")
            selected[result.point] = [e["tenant_id"] for e in envelopes]
            assert {e["data"]["scheduled_for"] for e in envelopes} <= {
                result.point.astimezone(UTC).isoformat().replace("+00:00", "Z")
            }
    return selected


def set_tier(database_url: str, tenant: str, tier: str) -> None:
    conn = psycopg2.connect(database_url)
    with conn, conn.cursor() as cur:
        cur.execute(
            "UPDATE core.tenants SET freshness_tier = %s WHERE tenant_id = %s", (tier, tenant)
        )
    conn.close()


def test_an_hourly_job_covers_every_tier_over_a_utc_day_and_follows_a_tier_change(
    harness: FanOutHarness, database_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    add_tenants(database_url, TENANTS)
    folder = write_job(tmp_path / "jobs", "freshness", "interval=timedelta(hours=1)")
    day = datetime(2025, 6, 1, tzinfo=UTC)
    scheduler = JobTestScheduler(
        jobs_dir=folder, redis=redis_client, started_at=day - timedelta(minutes=30)
    )
    # t-moves goes from nightly to 3h before the 08:00 point: next picked at 09:00, once
    selected = drive_hours(
        scheduler,
        harness,
        day,
        24,
        redis_client,
        before_hour={8: lambda: set_tier(database_url, "t-moves", "3h")},
    )
    assert len(selected) == 24
    counts = Counter(tenant for tenants in selected.values() for tenant in tenants)
    assert counts == {
        "t-1h": 24,
        "t-3h": 8,
        "t-6h": 4,
        "t-12h": 2,
        "t-nightly": 1,
        "t-moves": 1 + 5,
    }  # 00:00 as nightly, then 09, 12, 15, 18, 21
    for point, tenants in selected.items():
        assert len(tenants) == len(set(tenants)), point
    hours_of = {
        t: sorted(p.astimezone(UTC).hour for p, ts in selected.items() if t in ts)
        for t in ("t-12h", "t-nightly", "t-moves")
    }
    assert hours_of == {"t-12h": [0, 12], "t-nightly": [0], "t-moves": [0, 9, 12, 15, 18, 21]}


def test_tiers_follow_utc_hours_across_dst_changes_in_new_york(
    harness: FanOutHarness, database_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """An hourly cron on New York's wall clock: tiers still fall on UTC hours.

    Spring forward (2025-03-09, 02:00 EST → 03:00 EDT) leaves no UTC hour out. Fall back
    (2025-11-02, 01:00 EDT → 01:00 EST) repeats local 01:00, which the scheduled-jobs DST
    rule fires once, so that UTC hour (06:00) has no point: a 1h tenant misses it. The
    standard freshness job therefore uses ``interval=timedelta(hours=1)`` (UTC-aligned).
    """
    add_tenants(database_url, TENANTS)
    folder = write_job(
        tmp_path / "jobs", "freshness_ny", 'cron="0 * * * *", timezone="America/New_York"'
    )
    ny = ZoneInfo("America/New_York")
    for day, expected_points in (
        (datetime(2025, 3, 9, tzinfo=UTC), 24),
        (datetime(2025, 11, 2, tzinfo=UTC), 23),
    ):
        redis_client.flushall()
        scheduler = JobTestScheduler(
            jobs_dir=folder, redis=redis_client, started_at=day - timedelta(minutes=30)
        )
        selected = drive_hours(scheduler, harness, day, 24, redis_client)
        assert len(selected) == expected_points, sorted(selected)
        for point, tenants in selected.items():
            due = set(due_tiers(point))
            assert sorted(tenants) == sorted(t for t, tier in TENANTS if tier in due), point
        utc_hours = sorted(p.astimezone(UTC).hour for p in selected)
        missing = sorted(set(range(24)) - set(utc_hours))
        assert missing == ([] if expected_points == 24 else [6])
        twelve = sorted(p for p, ts in selected.items() if "t-12h" in ts)
        # 00:00 and 12:00 UTC, whatever the local clock says on either side of the change
        assert [p.astimezone(UTC).hour for p in twelve] == [0, 12]
        assert len({p.astimezone(ny).utcoffset() for p in selected}) == 2
