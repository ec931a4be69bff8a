"""``platform_queue_runnable``: on a saturated worker's ``/metrics``, the jobs of a fair queue
that a new worker could start now (real ``celery worker``, Redis and PostgreSQL).

One worker (3 pool processes, no ``-Q``) consumes the fair queue ``limits``. Two jobs of
tenant ``a`` hold both slots of their cap; jobs throttled to one an hour wait in the
delay store; four more jobs of tenant ``a`` are refused by the full cap; a third blocking
job then takes the last pool process, so the worker fetches nothing more while its timer
keeps sorting arrivals onto tenant lanes. What waits on the lanes then: the four capped
jobs (back from the delay store, their cap still full), three plain jobs and two capped
jobs of tenant ``b`` (whose cap is free). A new worker could start five of them.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from platform_tasks import QueuePort, create_app
from platform_tasks.keys import concurrency_waiting_key, delay_keys, fair_lane_keys
from platform_tasks.operations.pause import pause_queue
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import free_port, wait_until
from tests.apps.limits_app import CAP, QUEUE, RUNS_TABLE_SQL
from tests.conftest import REPO_ROOT
from tests.e2e.limits.test_limits import APP, job, runs
from tests.support.database import query
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

CAPPED = "tests.limits.capped"


@pytest.fixture
def port(settings: PlatformSettings) -> Iterator[QueuePort]:
    query(str(settings.database_url), RUNS_TABLE_SQL)
    query(str(settings.database_url), "TRUNCATE public.limit_runs")
    app = create_app("runnable_gauge_producer", settings=settings)
    qp = QueuePort(app)
    yield qp
    qp.close()
    app.close()


def scrape(metrics_port: int) -> dict[tuple[str, str], float]:
    """``(series, queue)`` -> value of the queue gauges on the worker's ``/metrics``."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, sample.labels.get("queue") or sample.labels.get("queue_name", "")): (
            sample.value
        )
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in ("celery_queue_length", "platform_queue_runnable")
    }


def test_runnable_counts_what_a_new_worker_could_start_and_a_paused_queue_counts_zero(
    settings: PlatformSettings,
    port: QueuePort,
    redis_url: str,
    database_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    metrics_port = free_port()
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            "PLATFORM_FAIR_QUEUES": QUEUE,
            "PLATFORM_METRICS_PORT": str(metrics_port),
            "PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1",
        },
    )
    argv = worker_argv(APP, concurrency=3, hostname="gauge@%h")
    blockers: list[dict[str, object]] = []
    with celery_processes() as started:
        worker = CeleryProcess(argv, env=env, cwd=REPO_ROOT, log_path=tmp_path / "worker.log")
        started.append(worker.start())
        worker.wait_for_log("ready.", timeout=90)
        try:
            _saturate(port, redis_client, database_url, blockers)
            for tenant in ("x", "y", "z"):
                port.publish(QUEUE, job("plain", tenant))
            for _ in range(2):
                port.publish(QUEUE, job("capped", "b"))
            lanes = fair_lane_keys(QUEUE)

            def settled() -> bool:
                gauges = scrape(metrics_port)
                return (
                    gauges.get(("celery_queue_length", QUEUE)) == 9
                    and redis_client.llen(QUEUE) == 0
                    and int(redis_client.get(lanes.waiting) or 0) == 9
                )

            wait_until(settled, timeout=60, message="9 jobs on the tenant lanes, none arriving")
            gauges = scrape(metrics_port)
            # an LLEN-based scaler reads 0 here: every job is on a tenant lane
            assert gauges[("platform_queue_runnable", QUEUE)] == 5, gauges
            assert redis_client.zcard(delay_keys("test").schedule) == 2, "the throttled jobs"
            assert query(database_url, "SELECT count(*) FROM core.dead_letters") == [(0,)]

            pause_queue(settings, QUEUE, actor="test")
            gauges = scrape(metrics_port)
            assert gauges[("platform_queue_runnable", QUEUE)] == 0
            assert gauges[("celery_queue_length", QUEUE)] == 9
        finally:
            for payload in blockers:
                redis_client.set(f"test:release:{payload['job_id']}", 1)


def _saturate(
    port: QueuePort,
    redis_client: redis.Redis,
    database_url: str,
    blockers: list[dict[str, object]],
) -> None:
    """Throttled jobs parked, tenant ``a``'s cap full with four jobs refused by it, and
    every pool process of the worker held."""
    for _ in range(3):
        port.publish(QUEUE, job("rare", "r"))
    wait_until(
        lambda: (
            len(runs(database_url, "rare")) == 1
            and redis_client.zcard(delay_keys("test").schedule) == 2
        ),
        timeout=60,
        message="one throttled job ran and two wait an hour in the delay store",
    )
    blockers.extend(job("capped", "a", block=True) for _ in range(CAP))
    for payload in blockers:
        port.publish(QUEUE, payload)
    wait_until(
        lambda: redis_client.llen("test:started") == CAP,
        timeout=60,
        message="tenant a holds both its slots",
    )
    for _ in range(4):
        port.publish(QUEUE, job("capped", "a"))
    waiting = concurrency_waiting_key("test", CAPPED)
    wait_until(
        lambda: redis_client.zcard(waiting) == 4,
        timeout=60,
        message="four jobs of tenant a refused by the full cap",
    )
    last = job("plain", "p", block=True)
    blockers.append(last)
    port.publish(QUEUE, last)
    wait_until(
        lambda: redis_client.llen("test:started") == CAP + 1,
        timeout=60,
        message="the third pool process is held too",
    )
