"""The cancel's sweep of the delay store on a real Redis broker and PostgreSQL: the queue
a stored job waits for is read without the broker's key prefix, and a cancelled job's
unique publish key is free again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.keys import delay_keys
from platform_tasks.operations import JobFilter, cancel_jobs
from platform_tasks.settings import PlatformSettings


def payload(tenant: str) -> dict[str, object]:
    return {"tenant_id": tenant, "kind": "tests.sweep", "data": {}}


def test_a_cancelled_delayed_job_frees_its_unique_key(
    settings: PlatformSettings, redis_client: redis.Redis
) -> None:
    app = create_app("sweep_unique", settings=settings)
    port = QueuePort(app)
    run_at = datetime.now(UTC) + timedelta(hours=1)
    window = timedelta(hours=2)
    try:
        first = port.schedule("q", payload("gone"), run_at, unique_key="k", unique_for=window)
        result = cancel_jobs(settings, JobFilter(tenant_id="gone"), actor="tester")
        assert result.delayed_cancelled == 1
        again = port.schedule("q", payload("gone"), run_at, unique_key="k", unique_for=window)
    finally:
        port.close()
        app.close()
    assert again != first  # the key was released with the cancel, not held for 2 hours
    assert redis_client.zcard(delay_keys("test").schedule) == 1


def test_the_sweep_matches_the_queue_under_the_brokers_key_prefix(
    settings: PlatformSettings, redis_client: redis.Redis
) -> None:
    app = create_app(
        "sweep_prefix", settings=settings, broker_transport_options={"global_keyprefix": "pfx:"}
    )
    port = QueuePort(app)
    run_at = datetime.now(UTC) + timedelta(hours=1)
    try:
        port.schedule("billing", payload("t1"), run_at)
        port.schedule("other", payload("t1"), run_at)
        result = cancel_jobs(settings, JobFilter(queue="billing"), actor="tester", app=app)
    finally:
        port.close()
        app.close()
    assert result.delayed_cancelled == 1
    assert redis_client.zcard(delay_keys("test").schedule) == 1
