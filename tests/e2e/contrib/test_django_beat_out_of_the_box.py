"""django-celery-beat as a new user sets it up: an app made by ``create_app`` and nothing
else, the worker started as the README starts it, three beat replicas with
``LeaseDatabaseScheduler``, and an every-second interval task created through Django's ORM
while they run.

The lease each trigger carries must be released when its run ends without any line the
user has to know about; otherwise each point between two runs is skipped as an overlap
and the task runs about once per lease TTL instead of every second.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from platform_tasks.testing.servers import PostgresServer, wait_until
from tests.conftest import REPO_ROOT
from tests.support.django_beat import django_beat_database, periodic_task
from tests.support.processes import CELERY, CeleryProcess, celery_processes, platform_env

APP = "tests.apps.django_beat_app"
SCHEDULER = "platform_tasks.contrib.django_celery_beat:LeaseDatabaseScheduler"
RECORD = "tests.django_beat.record"
RUNS = "test:dcb:runs"
WINDOW_MS = 20_000
"""How long the task's cadence is observed, from its first run."""
TICK_BOUND_MS = 5_000 + 1_000 + 2_000
"""An ORM edit reaches the first point within a tick: beat's longest sleep (5 s, its
``max_interval``) plus the one-second interval, plus slack for a loaded machine."""


def _redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()  # type: ignore[misc]
    return int(seconds) * 1000 + int(micros) // 1000


def _points(client: redis.Redis, label: str) -> list[int]:
    runs: list[dict[str, Any]] = [json.loads(raw) for raw in client.lrange(RUNS, 0, -1)]
    return [run["point_ms"] for run in runs if run["label"] == label and not run.get("expired")]


def test_interval_task_runs_every_second_with_a_plain_worker_and_three_replicas(
    postgres_server: PostgresServer, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    database_url = django_beat_database(postgres_server)  # sets Django up: import after it
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    env = platform_env(redis_url=redis_url, database_url=database_url)
    with celery_processes() as started:
        worker = CeleryProcess(
            [CELERY, "-A", APP, "worker", "--loglevel", "INFO"],
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        worker.wait_for_log("ready.", timeout=90)
        beats = [
            CeleryProcess(
                [CELERY, "-A", APP, "beat", "-S", SCHEDULER, "--loglevel", "INFO"],
                env=env,
                cwd=REPO_ROOT,
                log_path=tmp_path / f"beat{i}.log",
            ).start()
            for i in range(3)
        ]
        started.extend(beats)
        for beat in beats:
            beat.wait_for_log("lease database scheduler ready", timeout=90)

        created_ms = _redis_ms(redis_client)
        every_second = IntervalSchedule.objects.create(every=1, period="seconds")
        task = periodic_task(
            "every-second", task=RECORD, interval=every_second, args='["every-second"]'
        )
        try:
            wait_until(
                lambda: _points(redis_client, "every-second"), timeout=60, message="the first run"
            )
            first = min(_points(redis_client, "every-second"))
            end = first + WINDOW_MS
            wait_until(
                lambda: _redis_ms(redis_client) > end + 3_000,
                timeout=60,
                interval=0.2,
                message="the observed window",
            )
        except (TimeoutError, AssertionError) as exc:
            logs = "\n".join(b.log()[-2000:] for b in beats)
            raise AssertionError(f"{exc}\n{worker.log()[-3000:]}\n{logs}") from exc
        PeriodicTask.objects.filter(pk=task.pk).update(enabled=False)
        for beat in beats:
            beat.stop(timeout=30)
        worker.stop(timeout=30)
        beat_logs = [b.log() for b in beats]

    points = _points(redis_client, "every-second")
    assert first - created_ms <= TICK_BOUND_MS, (created_ms, first)
    duplicates = [p for p, n in Counter(points).items() if n > 1]
    assert duplicates == [], duplicates
    in_window = {p for p in points if first <= p < end}
    seconds = WINDOW_MS // 1000
    print(f"runs in the window: {len(in_window)} of {seconds} seconds")
    assert len(in_window) >= 0.7 * seconds, sorted(in_window)
    assert all("Traceback" not in log for log in beat_logs), beat_logs
