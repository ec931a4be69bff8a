"""The cancel's sweep of the delay store on a real Redis broker and PostgreSQL: the queue
a stored job waits for is read without the broker's key prefix, and a cancelled job's
unique publish key is free again."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg2
import pytest
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.consumer.cancels import CancelCheck
from platform_tasks.fanout import tenant_job_id
from platform_tasks.fanout.publisher import BatchPublisher
from platform_tasks.keys import delay_keys
from platform_tasks.observability.trace_context import publish_time_of
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


def _publish_times(redis_client: redis.Redis, queue: str) -> list[float | None]:
    """The publish time of each message on ``queue``, oldest first."""
    raws = reversed(redis_client.lrange(queue, 0, -1))  # LPUSH: the newest is first
    return [publish_time_of(json.loads(raw)["headers"]) for raw in raws]


@contextmanager
def skewed_host(monkeypatch: pytest.MonkeyPatch, app: Any, skew: timedelta) -> Iterator[QueuePort]:
    """A publisher on a host whose clock is ``skew`` off: ``time.time`` and the port's
    clock both read it (a real host's every clock is off alike)."""
    real = time.time
    with monkeypatch.context() as patched:
        patched.setattr(time, "time", lambda: real() + skew.total_seconds())
        port = QueuePort(app, clock=lambda: datetime.fromtimestamp(time.time(), UTC))
        try:
            yield port
        finally:
            port.close()


def test_a_publishers_clock_skew_does_not_move_its_jobs_across_the_cancel(
    settings: PlatformSettings, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app("sweep_skew", settings=settings)
    try:
        with skewed_host(monkeypatch, app, timedelta(hours=1)) as fast:
            fast.publish("skewed", payload("gone"))  # before the cancel, an hour fast
        result = cancel_jobs(settings, JobFilter(tenant_id="gone"), actor="tester")
        with skewed_host(monkeypatch, app, -timedelta(hours=1)) as slow:
            slow.publish("skewed", payload("gone"))  # after it, an hour slow
    finally:
        app.close()
    before, after = _publish_times(redis_client, "skewed")
    rule = result.rule
    assert rule.matches(published=before, tenant_id="gone", kind=None, queue="skewed")
    assert not rule.matches(published=after, tenant_id="gone", kind=None, queue="skewed")


def test_fan_out_children_are_judged_by_their_publish_not_their_points_time(
    settings: PlatformSettings, redis_client: redis.Redis
) -> None:
    """A child's id carries its point's time: a day-old point published after the cancel
    is new work, a point a day ahead published before it is cancelled."""
    app = create_app("sweep_fanout", settings=settings)
    port = QueuePort(app)
    now = datetime.now(UTC)

    def child(point: datetime) -> Any:
        job_id = tenant_job_id("nightly", point, "tests.child", "gone")
        payload = {"job_id": str(job_id), "tenant_id": "gone", "kind": "tests.child", "data": {}}
        return port.envelope(payload)

    publisher = BatchPublisher(app, queue="fanned")
    try:
        publisher.publish([child(now + timedelta(days=1))])  # before the cancel
        result = cancel_jobs(settings, JobFilter(tenant_id="gone"), actor="tester")
        publisher.publish([child(now - timedelta(days=1))])  # after it
    finally:
        publisher.close()
        port.close()
        app.close()
    before, after = _publish_times(redis_client, "fanned")
    assert result.rule.matches(published=before, tenant_id="gone", kind=None, queue="fanned")
    assert not result.rule.matches(published=after, tenant_id="gone", kind=None, queue="fanned")


def test_a_rule_row_that_cannot_be_read_is_logged_and_never_a_wait(
    settings: PlatformSettings, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A rule row the consumer cannot turn into a filter (a blank tenant written by hand)
    is a programming error, not an outage: the check answers from the rules last read."""
    result = cancel_jobs(settings, JobFilter(tenant_id="gone"), actor="tester")
    check = CancelCheck(clock=iter(range(0, 10_000, 10)).__next__)  # every read is stale
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            assert [rule.operation_id for rule in check.rules(cur)] == [result.operation.id]
            cur.execute("UPDATE core.cancel_rules SET tenant_id = ' '")
        with conn, conn.cursor() as cur, caplog.at_level("ERROR"):
            rules = check.rules(cur)
            cur.execute("SELECT 1")  # the job's transaction is still usable
    finally:
        conn.close()
    assert [rule.operation_id for rule in rules] == [result.operation.id]
    events = [getattr(record, "event", None) for record in caplog.records]
    assert events == ["operations.cancel_rules_unreadable"]
