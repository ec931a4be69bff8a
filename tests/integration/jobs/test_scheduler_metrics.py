"""Delay-store gauges and the lease-renewal counter, measured against the real Redis."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import redis
from prometheus_client import REGISTRY

from platform_tasks.keys import delay_keys
from platform_tasks.publishing.delay_promoter import DelayPromoter
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing import JobTestScheduler


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_delay_gauges_count_waiting_entries_and_the_oldest_overdue_one(
    redis_url: str, redis_client: redis.Redis
) -> None:
    settings = PlatformSettings.build(redis_url=redis_url, profile="test", metrics_port=9)
    store = DelayStore(redis_client, delay_keys("test"))
    promoter = DelayPromoter(settings)
    seconds, _ = redis_client.time()
    now_ms = int(seconds) * 1000
    promoter.measure(store)
    assert _value("platform_delay_entries_waiting") == 0
    assert _value("platform_delay_promotion_lag_seconds") == 0
    # two entries 90 s and 30 s overdue (nobody promoted them) and one due in an hour
    store.add("a", now_ms - 90_000, "q", "{}")
    store.add("b", now_ms - 30_000, "q", "{}")
    store.add("c", now_ms + 3_600_000, "q", "{}")
    promoter.measure(store)
    assert _value("platform_delay_entries_waiting") == 3
    assert 90 <= _value("platform_delay_promotion_lag_seconds") < 150
    promoted_before = _value("platform_delay_promoted_total")
    assert promoter.run_once(store) == 2
    promoter.measure(store)
    assert _value("platform_delay_entries_waiting") == 1
    assert _value("platform_delay_promotion_lag_seconds") == 0
    assert _value("platform_delay_promoted_total") == promoted_before + 2


STEALS_ITS_LEASE = """
from datetime import timedelta
import redis
from platform_tasks.jobs import define_job

def run(ctx):
    client = redis.Redis.from_url({url!r})
    lease = [key for key in client.keys("*") if key.endswith(b":lease")][0]
    client.set(lease, "another-owner")       # someone else holds the lease now
    client.close()
    if not ctx.cancel_requested.wait(60):
        raise RuntimeError("renewal never noticed the lost lease")

define_job(handler=run, interval=timedelta(minutes=1), lease_ttl=timedelta(seconds=1))
"""


def test_a_lost_lease_counts_a_failed_renewal(
    jobs_dir, redis_url: str, redis_client: redis.Redis
) -> None:
    folder: Path = jobs_dir({"stolen.py": STEALS_ITS_LEASE.format(url=redis_url)})
    start = datetime(2025, 1, 1, 12, 0, 7, tzinfo=UTC)
    scheduler = JobTestScheduler(jobs_dir=folder, redis=redis_client, started_at=start)
    before = _value("platform_job_lease_renewals_failed_total", job="stolen", reason="lost")
    # run inline: the handler sees its cancellation once the renewal finds the lease gone
    [result] = scheduler.tick(at=datetime(2025, 1, 1, 12, 1, tzinfo=UTC))
    assert (result.outcome, result.run) == ("admitted", "succeeded")
    after = _value("platform_job_lease_renewals_failed_total", job="stolen", reason="lost")
    assert after == before + 1
