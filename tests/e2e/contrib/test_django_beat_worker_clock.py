"""A worker whose clock is skewed judges the expiry of ``LeaseDatabaseScheduler``'s
triggers by Redis TIME, not by its own clock.

The skew is real: the worker runs under libfaketime (``LD_PRELOAD`` with ``FAKETIME``;
monotonic clocks left alone), so every clock read in it, Celery's included, is off. The
worker is the README's (``celery -A app worker --loglevel INFO``) of an app made by
``create_app``.

* 30 s ahead, with a real beat sending an every-second task: the triggers run (a worker
  judging by its own clock discards every one as expired);
* 120 s behind, given a trigger whose period ended 20 s ago (published as the scheduler
  sends it, with the message expiry at the period's end as earlier versions sent it): it
  is discarded as expired, not run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import libfaketime
import redis
from celery import Celery

from platform_tasks.contrib.beat_leases import LEASE_HEADER, LeaseGrant
from platform_tasks.jobs.points import from_ms
from platform_tasks.testing.servers import PostgresServer, wait_until
from tests.conftest import REPO_ROOT
from tests.support.django_beat import django_beat_database, periodic_task
from tests.support.processes import CELERY, CeleryProcess, celery_processes, platform_env

APP = "tests.apps.django_beat_app"
SCHEDULER = "platform_tasks.contrib.django_celery_beat:LeaseDatabaseScheduler"
RECORD = "tests.django_beat.record"
RUNS = "test:dcb:runs"
FAKETIME_LIB = Path(libfaketime.__file__).parent / "vendor/libfaketime/src/libfaketime.so.1"


def _skewed(env: dict[str, str], offset: str) -> dict[str, str]:
    return dict(env, LD_PRELOAD=str(FAKETIME_LIB), FAKETIME=offset, DONT_FAKE_MONOTONIC="1")


def _runs(client: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in client.lrange(RUNS, 0, -1)]


def _redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()  # type: ignore[misc]
    return int(seconds) * 1000 + int(micros) // 1000


def _header(namespace: str, label: str, point_ms: int, period_end_ms: int) -> dict[str, Any]:
    """The lease header as the scheduler sends it (the period's end included)."""
    grant = LeaseGrant(namespace, "", "periodic-task-9", f"beat:{label}", 60_000, point_ms)
    return dict(grant.to_header(), period_end_ms=period_end_ms)


def _worker(env: dict[str, str], tmp_path: Path, name: str) -> CeleryProcess:
    return CeleryProcess(
        [CELERY, "-A", APP, "worker", "--loglevel", "INFO"],
        env=env,
        cwd=REPO_ROOT,
        log_path=tmp_path / f"{name}.log",
    )


def test_a_worker_ahead_of_redis_runs_the_triggers_of_a_real_beat(
    postgres_server: PostgresServer, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    database_url = django_beat_database(postgres_server)  # sets Django up: import after it
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    env = platform_env(redis_url=redis_url, database_url=database_url)
    every_second = IntervalSchedule.objects.create(every=1, period="seconds")
    task = periodic_task("skewed", task=RECORD, interval=every_second, args='["skewed"]')
    with celery_processes() as started:
        worker = _worker(_skewed(env, "+30s"), tmp_path, "worker").start()
        started.append(worker)
        worker.wait_for_log("ready.", timeout=90)
        beat = CeleryProcess(
            [CELERY, "-A", APP, "beat", "-S", SCHEDULER, "--loglevel", "INFO"],
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "beat.log",
        ).start()
        started.append(beat)
        try:
            wait_until(
                lambda: sum(1 for r in _runs(redis_client) if not r.get("expired")) >= 3,
                timeout=60,
                message="three runs on the skewed worker",
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{worker.log()[-3000:]}\n{beat.log()[-2000:]}") from exc
        PeriodicTask.objects.filter(pk=task.pk).update(enabled=False)
        beat.stop(timeout=30)
        worker.stop(timeout=30)


def test_a_worker_behind_redis_discards_a_trigger_whose_period_ended(
    redis_url: str, database_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    env = platform_env(redis_url=redis_url, database_url=database_url)
    sender = Celery("sender", broker=redis_url)
    namespace = "platform:django_beat_app:test:django-celery-beat"
    with celery_processes() as started:
        worker = _worker(_skewed(env, "-120s"), tmp_path, "worker").start()
        started.append(worker)
        worker.wait_for_log("ready.", timeout=90)
        now = _redis_ms(redis_client)
        point, end = now - 30_000, now - 20_000
        header = _header(namespace, "late", point, end)
        sender.send_task(
            RECORD,
            args=["late"],
            queue="default",
            expires=from_ms(end),
            headers={LEASE_HEADER: header},
        )
        # a barrier: a trigger of a later point whose period has not ended runs
        point, end = now, now + 600_000
        header = _header(namespace, "fresh", point, end)
        sender.send_task(
            RECORD,
            args=["fresh"],
            queue="default",
            expires=from_ms(end),
            headers={LEASE_HEADER: header},
        )
        try:
            wait_until(
                lambda: len(_runs(redis_client)) >= 2, timeout=60, message="both triggers judged"
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{worker.log()[-3000:]}") from exc
        worker.stop(timeout=30)
        log = worker.log()
    sender.close()
    runs = {(r["label"], bool(r.get("expired"))) for r in _runs(redis_client)}
    assert runs == {("late", True), ("fresh", False)}, (runs, log[-3000:])
