"""Fan-out on RabbitMQ: real ``celery -A tests.apps.fanout_app worker`` processes (no ``-Q``)
with ``PLATFORM_BROKER_URL`` on a fresh virtual host; tenants in PostgreSQL, each tenant
job's application a row of ``public.fanout_applied`` (no unique key)."""

from __future__ import annotations

from collections.abc import Callable

from platform_tasks import QueuePort
from platform_tasks.fanout import fan_out
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.fanout_app import GATED_TENANTS_QUERY, KIND, WORK_QUEUE
from tests.e2e.brokers.rabbitmq.conftest import Workers, vhost_of
from tests.support.fanout import (
    applied,
    assert_each_tenant_applied_once,
    ctx,
    make_tenants,
    progress,
    sql,
)
from tests.support.servers import RabbitMQServer

__all__ = ["make_tenants"]  # fixtures

APP = "tests.apps.fanout_app"
FAILED = "retry: attempt"
"""In a worker's log when a delivery failed (no fan-out here should)."""


def _all_queues_empty(server: RabbitMQServer, settings: PlatformSettings) -> bool:
    return not any(server.queue_depths(vhost_of(settings)).values())


def test_a_fan_out_on_rabbitmq_applies_every_tenant_once(
    port: QueuePort,
    workers: Workers,
    broker_settings: PlatformSettings,
    rabbitmq_server: RabbitMQServer,
    make_tenants: Callable[[int], int],
) -> None:
    database_url = str(broker_settings.database_url)
    tenants = make_tenants(300)
    worker = workers.start(
        "w1", app=APP, concurrency=2, PLATFORM_JOBS_ENABLED="false", PLATFORM_FANOUT_BATCH_SIZE="40"
    )
    fan_out(ctx(), queue=WORK_QUEUE, kind=KIND, port=port)
    wait_until(
        lambda: progress(database_url) == (tenants, True) or FAILED in worker.log(),
        timeout=120,
        message="the fan-out finished",
    )
    assert progress(database_url) == (tenants, True), worker.log()[-3000:]
    wait_until(
        lambda: applied(database_url) >= tenants, timeout=180, message="every tenant job applied"
    )
    wait_until(
        lambda: _all_queues_empty(rabbitmq_server, broker_settings),
        timeout=60,
        message="every queue of the vhost empty",
    )
    assert_each_tenant_applied_once(database_url, tenants)
    assert f"published {tenants} tenant(s)" in worker.log()
    assert sql(database_url, "SELECT count(*) FROM core.dead_letters") == [(0,)]


def test_a_fan_out_on_rabbitmq_killed_mid_publish_resumes_and_applies_every_tenant_once(
    port: QueuePort,
    workers: Workers,
    broker_settings: PlatformSettings,
    rabbitmq_server: RabbitMQServer,
    make_tenants: Callable[[int], int],
) -> None:
    """Needs PLATFORM_TENANTS_QUERY: the gated query holds the stream before ``t-0500``
    while ``fanout_hold`` has a row, so the SIGKILL lands mid-publish on purpose."""
    database_url = str(broker_settings.database_url)
    tenants = make_tenants(1000)
    sql(database_url, "INSERT INTO public.fanout_hold VALUES ('hold the stream at t-0500')")
    extra = {
        "PLATFORM_TENANTS_QUERY": GATED_TENANTS_QUERY,
        "PLATFORM_FANOUT_BATCH_SIZE": "50",
        "PLATFORM_JOBS_ENABLED": "false",
    }
    first = workers.start("w1", app=APP, concurrency=2, **extra)
    fan_out(ctx(), queue=WORK_QUEUE, kind=KIND, port=port)
    wait_until(
        lambda: progress(database_url) == (500, False) or FAILED in first.log(),
        timeout=90,
        message="500 tenants published, waiting at t-0500",
    )
    assert progress(database_url) == (500, False), first.log()[-3000:]
    first.kill_group()
    sql(database_url, "DELETE FROM public.fanout_hold")
    second = workers.start("w2", app=APP, concurrency=2, **extra)
    wait_until(
        lambda: progress(database_url) == (tenants, True),
        timeout=120,
        message="the redelivered fan-out finished",
    )
    wait_until(
        lambda: applied(database_url) >= tenants, timeout=180, message="every tenant job applied"
    )
    # redeliveries of the jobs the killed worker held arrive and are skipped
    wait_until(
        lambda: _all_queues_empty(rabbitmq_server, broker_settings),
        timeout=90,
        message="every queue of the vhost empty",
    )
    log = second.log()
    assert "resuming after tenant 't-0499'" in log
    assert "published 500 tenant(s)" in log
    assert_each_tenant_applied_once(database_url, tenants)
    assert sql(database_url, "SELECT count(*) FROM core.dead_letters") == [(0,)]
