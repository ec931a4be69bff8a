"""A trigger of ``LeaseDatabaseScheduler`` delivered again after its point ran (a real
duplicate message on the broker, as a redelivery after a worker died before its ack
leaves one) does not run the task a second time.

The worker is the README's (``celery -A app worker --loglevel INFO``) of an app made by
``create_app``; the triggers are published with the lease header exactly as the scheduler
sends it, the duplicate with the same task id and headers.
"""

from __future__ import annotations

import json
from pathlib import Path

import redis
from celery import Celery

from platform_tasks.contrib.beat_leases import LEASE_HEADER, LeaseGrant
from platform_tasks.testing.servers import wait_until
from tests.conftest import REPO_ROOT
from tests.support.processes import CELERY, CeleryProcess, celery_processes, platform_env

APP = "tests.apps.django_beat_app"
RECORD = "tests.django_beat.record"
RUNS = "test:dcb:runs"
NAMESPACE = "platform:django_beat_app:test:django-celery-beat"


def _trigger(sender: Celery, point_ms: int, label: str) -> None:
    grant = LeaseGrant(NAMESPACE, "", "periodic-task-7", f"beat:{point_ms}", 60_000, point_ms)
    sender.send_task(
        RECORD,
        args=[label],
        task_id=f"trigger-{point_ms}",
        queue="default",
        headers={LEASE_HEADER: grant.to_header()},
    )


def _labels(client: redis.Redis) -> list[str]:
    return [json.loads(raw)["label"] for raw in client.lrange(RUNS, 0, -1)]


def test_a_redelivered_trigger_of_a_point_that_ran_does_not_run_again(
    redis_url: str, database_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    env = platform_env(redis_url=redis_url, database_url=database_url)
    sender = Celery("sender", broker=redis_url)
    with celery_processes() as started:
        worker = CeleryProcess(
            [CELERY, "-A", APP, "worker", "--loglevel", "INFO"],
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        worker.wait_for_log("ready.", timeout=90)
        try:
            _trigger(sender, 1_000, "first")
            wait_until(
                lambda: _labels(redis_client) == ["first"], timeout=60, message="the first run"
            )
            _trigger(sender, 1_000, "first")  # the same message again
            _trigger(sender, 2_000, "next")  # the next point: the duplicate was taken before
            wait_until(
                lambda: "next" in _labels(redis_client), timeout=60, message="the next point's run"
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{worker.log()[-3000:]}") from exc
        worker.stop(timeout=30)
        log = worker.log()
    sender.close()
    assert _labels(redis_client) == ["first", "next"], (_labels(redis_client), log[-3000:])
