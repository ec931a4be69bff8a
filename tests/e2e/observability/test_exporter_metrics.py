"""A real prefork worker's ``/metrics``: celery-exporter's series with its exact names and
labels, beside the platform's queue latency and pending dead letters.

The expected names and label names are celery-exporter's, read from its source
(``src/exporter.py`` of danihodovic/celery-exporter at 95e8e492f0cb, August 2026): the
state counters are labelled ``name, hostname, queue_name`` (``task-failed`` adds
``exception``), ``celery_task_runtime`` the same three, ``celery_worker_up``
``hostname`` and ``celery_queue_length`` ``queue_name``. The age of the waiting job is
injected through its publish time (a queue port with a clock 30 s behind), not slept.
"""

from __future__ import annotations

import socket
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis
from prometheus_client.parser import text_string_to_metric_families

from platform_tasks import QueuePort, create_app
from platform_tasks.brokers.queue_latency import DEAD_LETTER_REFRESH_SECONDS
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import free_port, wait_until
from tests.apps.consumer_app import QUEUE, WORK_TABLE_SQL
from tests.conftest import REPO_ROOT
from tests.support.database import query
from tests.support.processes import celery_processes, platform_env, start_worker

APP = "tests.apps.consumer_app"
TASK = "tests.consumer.apply"
WAITING_AGE_SECONDS = 30

_TASK_LABELS = {"name", "hostname", "queue_name"}
EXPORTER_SERIES: dict[str, set[str]] = {
    "celery_task_sent_total": _TASK_LABELS,
    "celery_task_received_total": _TASK_LABELS,
    "celery_task_started_total": _TASK_LABELS,
    "celery_task_succeeded_total": _TASK_LABELS,
    "celery_task_failed_total": {"name", "hostname", "exception", "queue_name"},
    "celery_task_retried_total": _TASK_LABELS,
    "celery_task_runtime_bucket": _TASK_LABELS | {"le"},
    "celery_task_runtime_count": _TASK_LABELS,
    "celery_task_runtime_sum": _TASK_LABELS,
    "celery_worker_up": {"hostname"},
    "celery_worker_tasks_active": {"hostname"},
    "celery_queue_length": {"queue_name"},
}

Samples = list[tuple[str, dict[str, str], float]]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def value(samples: Samples, series: str, **labels: str) -> float | None:
    """The sum of ``series`` over the samples whose labels include ``labels``."""
    found = [
        number
        for name, have, number in samples
        if name == series and all(have.get(k) == v for k, v in labels.items())
    ]
    return sum(found) if found else None


def test_prefork_worker_serves_celery_exporter_series_and_queue_latency(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    query(database_url, WORK_TABLE_SQL)
    multiproc_dir = tmp_path / "prometheus"
    multiproc_dir.mkdir()
    port = free_port()
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir),
            "PLATFORM_METRICS_PORT": str(port),
            "PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1",
        },
    )
    settings = PlatformSettings.build(
        redis_url=redis_url, database_url=database_url, profile="test"
    )
    web = create_app("metrics_web", settings=settings)
    port_now = QueuePort(web)
    port_30s_ago = QueuePort(
        web, clock=lambda: datetime.now(UTC) - timedelta(seconds=WAITING_AGE_SECONDS)
    )
    client = redis.Redis.from_url(redis_url)
    host = socket.gethostname()

    def job(data: dict[str, object]) -> dict[str, object]:
        return {"tenant_id": "acme", "kind": TASK, "data": data}

    with celery_processes() as started:
        worker = start_worker(
            started, APP, env=env, cwd=REPO_ROOT, log_path=tmp_path / "worker.log"
        )
        ids = [
            port_now.publish(QUEUE, job({"key": "ok"})),
            port_now.publish(QUEUE, job({"key": "retried", "fail_times": 1})),
            port_now.publish(QUEUE, job({"key": "dead", "permanent": True})),
        ]

        def settled() -> bool:
            samples = scrape(port)
            return (
                value(samples, "celery_task_succeeded_total", name=TASK) == 2
                and value(samples, "celery_task_failed_total", name=TASK) == 1
            )

        try:
            wait_until(settled, timeout=60, interval=0.2, message="three jobs settled")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {scrape(port)}\n{worker.log()[-4000:]}") from exc

        # the one pool process is busy: a job published "30 s ago" waits at the queue head
        blocker = port_now.publish(QUEUE, job({"key": "block", "block": True}))
        wait_until(
            lambda: client.llen("test:started") >= 1, timeout=30, message="the blocking job running"
        )
        ids += [blocker, port_30s_ago.publish(QUEUE, job({"key": "waiting"}))]

        def waiting_seen() -> bool:
            return value(scrape(port), "celery_queue_length", queue_name=QUEUE) == 1

        wait_until(waiting_seen, timeout=30, message="the waiting job counted in the queue")
        waiting = scrape(port)
        client.set(f"test:release:{blocker}", 1)
        wait_until(
            lambda: value(scrape(port), "celery_task_succeeded_total", name=TASK) == 4,
            timeout=60,
            interval=0.2,
            message="the blocked and waiting jobs ran",
        )
        drained = scrape(port)
        # read from PostgreSQL at most every DEAD_LETTER_REFRESH_SECONDS
        wait_until(
            lambda: value(scrape(port), "platform_dead_letters_pending", queue=QUEUE) == 1,
            timeout=DEAD_LETTER_REFRESH_SECONDS + 15,
            message="the dead letter counted as pending",
        )
    client.close()
    port_now.close()
    port_30s_ago.close()

    # celery-exporter's names, each with exactly its label names
    for name, label_names in EXPORTER_SERIES.items():
        label_sets = [set(labels) for n, labels, _ in drained if n == name]
        assert label_sets, f"{name} missing from /metrics"
        assert all(s == label_names for s in label_sets), (name, label_sets)
    at = {"name": TASK, "hostname": host, "queue_name": QUEUE}
    assert value(drained, "celery_task_received_total", **at) == 6  # 5 jobs, one retried
    assert value(drained, "celery_task_started_total", **at) == 6
    assert value(drained, "celery_task_succeeded_total", **at) == 4
    assert value(drained, "celery_task_retried_total", **at) == 1
    assert value(drained, "celery_task_failed_total", exception="PermanentError", **at) == 1
    assert value(drained, "celery_task_runtime_count", **at) == 4
    assert value(drained, "celery_task_sent_total", name=TASK, queue_name=QUEUE) == 1  # the retry
    assert value(drained, "celery_worker_up", hostname=host) == 1
    assert value(drained, "celery_worker_tasks_active", hostname=host) == 0  # all done
    # queue latency: the waiting job's age, read from the head of the queue; 0 once drained
    latency = value(waiting, "platform_queue_latency_seconds", queue=QUEUE)
    assert latency is not None and latency >= WAITING_AGE_SECONDS
    assert value(drained, "platform_queue_latency_seconds", queue=QUEUE) == 0
    assert value(drained, "celery_queue_length", queue_name=QUEUE) == 0
    # bounded labels: no job id anywhere
    job_ids = {str(i) for i in ids} | {uuid.UUID(str(i)).hex for i in ids}
    assert not [s for s in drained if job_ids & set(s[1].values())]
