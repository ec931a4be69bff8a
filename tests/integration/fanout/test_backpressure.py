"""A fan-out whose queue stays full hands itself back, marker kept, and resumes (real Redis
and PostgreSQL; the fan-out consumer's code run in this process, the consumers played by
the test emptying the queue between deliveries)."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

import psycopg2
import pytest
import redis

from platform_tasks.errors import Throttled
from platform_tasks.fanout import fan_out, tenant_job_id
from platform_tasks.fanout.backpressure import QueueBound
from platform_tasks.jobs.runner import JobContext
from platform_tasks.publishing.outbox_relay import OutboxRelay

from .conftest import FanOutHarness, add_tenants, decode

POINT = datetime(2025, 5, 6, 3, 0, tzinfo=UTC)
JOB, KIND, QUEUE = "maintenance.bounded", "demo.bounded", "bounded_work"


def test_a_full_queue_throttles_the_fan_out_and_the_next_delivery_resumes_at_its_marker(
    harness: FanOutHarness, database_url: str, redis_client: redis.Redis
) -> None:
    tenants = [f"t-{n:03d}" for n in range(250)]
    add_tenants(database_url, [(tenant, "nightly") for tenant in tenants])
    settings = harness.settings.model_copy(
        update={"fanout_batch_size": 50, "fanout_max_queue_depth": 100}
    )
    ctx = JobContext(
        name=JOB,
        scheduled_for=POINT,
        cancel_requested=threading.Event(),
        logger=logging.getLogger("test"),
    )
    fan_out(ctx, queue=QUEUE, kind=KIND)
    [envelope] = harness.pending_fan_outs()
    consumed: list[str] = []
    deliveries = 0
    while True:
        deliveries += 1
        bound = QueueBound(settings.fanout_max_queue_depth, wait_seconds=0.3, poll_seconds=0.05)
        try:
            result = harness.run(envelope, settings, bound=bound)
        except Throttled as exc:
            assert exc.reason == "fanout_queue_full"
            assert redis_client.llen(QUEUE) == 100  # filled to the bound, not beyond
            # the consumers catch up: everything waiting is taken off the queue
            consumed += [decode(raw)[1]["job_id"] for raw in redis_client.lrange(QUEUE, 0, -1)]
            redis_client.delete(QUEUE)
            continue
        break
    consumed += [decode(raw)[1]["job_id"] for raw in redis_client.lrange(QUEUE, 0, -1)]
    assert deliveries == 3  # 100, 100, then the last 50 fit
    assert (result.published_now, result.published_total) == (50, 250)
    assert sorted(consumed) == sorted(str(tenant_job_id(JOB, POINT, KIND, t)) for t in tenants)


def test_rows_waiting_in_the_outbox_for_the_queue_count_against_the_bound(
    harness: FanOutHarness, database_url: str, redis_client: redis.Redis
) -> None:
    """Committed outbox rows are on their way to the queue (the relay moves them within
    moments): a fan-out that ignored them would take the queue past its bound."""
    add_tenants(database_url, [(f"t-{n:03d}", "nightly") for n in range(250)])
    settings = harness.settings.model_copy(
        update={"fanout_batch_size": 50, "fanout_max_queue_depth": 100}
    )
    conn = psycopg2.connect(database_url)
    with conn:
        for n in range(30):
            harness.port.publish(QUEUE, _job(n), tx=conn)
        for n in range(5):  # another queue's rows do not count
            harness.port.publish("elsewhere", _job(n), tx=conn)
        for n in range(5):  # nor rows due later: they wait in the delay store, not the queue
            harness.port.schedule(QUEUE, _job(n), datetime.now(UTC) + timedelta(hours=1), tx=conn)
    conn.close()
    ctx = JobContext(
        name=JOB,
        scheduled_for=POINT,
        cancel_requested=threading.Event(),
        logger=logging.getLogger("test"),
    )
    fan_out(ctx, queue=QUEUE, kind=KIND)
    [envelope] = harness.pending_fan_outs()
    bound = QueueBound(settings.fanout_max_queue_depth, wait_seconds=0.3, poll_seconds=0.05)
    with pytest.raises(Throttled):
        harness.run(envelope, settings, bound=bound)
    assert redis_client.llen(QUEUE) == 50, "30 waiting in the outbox + 50 fit under 100"
    relay = OutboxRelay(harness.app, metrics=False)
    try:
        assert relay.run_once() == 40
    finally:
        relay.close()
    assert redis_client.llen(QUEUE) == 80, "relayed, the queue is still within its bound"


def _job(n: int) -> dict[str, object]:
    return {"tenant_id": f"o-{n}", "kind": KIND, "data": {}}
