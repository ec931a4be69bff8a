"""A fan-out SIGKILLed mid-publish through real ``celery worker`` processes, redelivered,
applies each of 1,000 tenants' jobs once (queues named with ``-Q``: see
``tests/support/fanout.py``), and its ``on_complete`` fires exactly once, after the last
tenant's job ended."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis

from platform_tasks import QueuePort
from platform_tasks.batches import Callback
from platform_tasks.fanout import fan_out
from platform_tasks.testing.servers import wait_until
from tests.apps.fanout_app import DONE_KIND, GATED_TENANTS_QUERY, KIND, WORK_QUEUE
from tests.support.fanout import (
    applied,
    assert_each_tenant_applied_once,
    ctx,
    fanout_worker,
    make_tenants,
    port,
    progress,
    sql,
)
from tests.support.processes import celery_processes, platform_env

__all__ = ["make_tenants", "port"]  # fixtures


def test_fan_out_killed_mid_publish_and_redelivered_applies_every_tenant_once(
    redis_url: str,
    database_url: str,
    make_tenants: Callable[[int], int],
    port: QueuePort,
    tmp_path: Path,
) -> None:
    """Needs PLATFORM_TENANTS_QUERY: the gated query holds the stream before ``t-0500``
    while ``fanout_hold`` has a row, so the kill lands mid-publish on purpose, not by luck,
    after the jobs of the first 500 tenants have all ended."""
    tenants = make_tenants(1000)
    sql(database_url, "INSERT INTO public.fanout_hold VALUES ('hold the stream at t-0500')")
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            "PLATFORM_TENANTS_QUERY": GATED_TENANTS_QUERY,
            "PLATFORM_FANOUT_BATCH_SIZE": "50",
            "PLATFORM_VISIBILITY_TIMEOUT_SECONDS": "5",
            "PLATFORM_JOBS_ENABLED": "false",
        },
    )
    with celery_processes() as started:
        first = fanout_worker(env, tmp_path / "w1.log", "w1").start()
        started.append(first)
        first.wait_for_log("ready.")
        done = Callback(queue=WORK_QUEUE, kind=DONE_KIND, tenant_id="ops", data={"n": 1})
        fan_id = fan_out(ctx(), queue=WORK_QUEUE, kind=KIND, port=port, on_complete=done)
        wait_until(
            lambda: progress(database_url) == (500, False),
            timeout=60,
            message="the fan-out published 500 tenants and waits at t-0500",
        )
        # the first 500 tenants' jobs all end while the fan-out is held mid-publish: its
        # batch must not complete (the fan-out job's own row keeps it open)
        wait_until(
            lambda: applied(database_url) == 500,
            timeout=120,
            message="the first 500 tenant jobs applied while the fan-out waits",
        )
        first.kill_group()
        sql(database_url, "DELETE FROM public.fanout_hold")
        second = fanout_worker(env, tmp_path / "w2.log", "w2").start()
        started.append(second)
        wait_until(
            lambda: progress(database_url) == (1000, True),
            timeout=90,
            message="the redelivered fan-out finished",
        )
        wait_until(
            lambda: applied(database_url) >= tenants,
            timeout=120,
            message="every tenant job applied",
        )
        wait_until(
            lambda: sql(database_url, "SELECT count(*) FROM public.fanout_completed") != [(0,)],
            timeout=60,
            message="the fan-out's on_complete applied",
        )
        second.wait_for_log("resuming after tenant 't-0499'")
        assert "published 500 tenant(s)" in second.log()
        # let redeliveries of jobs the killed worker held arrive and be skipped
        wait_until(
            lambda: redis.Redis.from_url(redis_url).llen(WORK_QUEUE) == 0,
            timeout=60,
            message="work queue drained",
        )
    assert_each_tenant_applied_once(database_url, tenants)
    rows = sql(
        database_url, "SELECT count(*) FROM core.processed_jobs WHERE job_id = %s", (str(fan_id),)
    )
    assert rows == [(1,)]
    assert sql(database_url, "SELECT count(*) FROM core.dead_letters") == [(0,)]
    # on_complete exactly once, after every tenant's job had been applied; the fan-out's
    # batch counts the fan-out job itself (its row kept the batch open between pages)
    [(batch_id, counts, applied_before)] = sql(
        database_url, "SELECT batch_id, counts, applied_before FROM public.fanout_completed"
    )
    assert batch_id == str(fan_id)
    assert applied_before == tenants
    assert counts == {
        "applied": tenants + 1,
        "dead_lettered": 0,
        "discarded": 0,
        "cancelled": 0,
        "total": tenants + 1,
    }
    assert sql(
        database_url,
        "SELECT count(*) FILTER (WHERE outcome = 'applied'), count(*) FROM core.batch_jobs"
        " WHERE batch_id = %s",
        (str(fan_id),),
    ) == [(tenants + 1, tenants + 1)]
