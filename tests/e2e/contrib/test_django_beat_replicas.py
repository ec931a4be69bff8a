"""Three real ``celery beat -S platform_tasks.contrib.django_celery_beat:LeaseDatabaseScheduler``
replicas and one worker, schedules in PostgreSQL edited through Django's ORM (as admin does).

Checked from the worker's own records (runs, and triggers it discarded because they
expired in the queue: both are admitted points) and the rows: each point runs at most once, an
interval edit is picked up, enabling or editing a task whose ``last_run_at`` is long past
does not run it, a one-off runs once and disables itself, a run holding its lease makes
its next points skip (no overlap), and only the admitting replica writes the run
metadata. The commands are those of docs/django-celery-beat.md and the README; the worker has no
``-Q``.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from platform_tasks.testing.servers import PostgresServer, wait_until
from tests.conftest import REPO_ROOT
from tests.support.django_beat import django_beat_database, periodic_task
from tests.support.processes import (
    CELERY,
    CeleryProcess,
    celery_processes,
    platform_env,
    worker_argv,
)

APP = "tests.apps.django_beat_app"
SCHEDULER = "platform_tasks.contrib.django_celery_beat:LeaseDatabaseScheduler"
RECORD = "tests.django_beat.record"
RUNS = "test:dcb:runs"
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


def _runs(client: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in client.lrange(RUNS, 0, -1)]


def _of(runs: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    return [run for run in runs if run["label"] == label]


def test_three_replicas_edits_one_off_and_overlap(
    postgres_server: PostgresServer, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    database_url = django_beat_database(postgres_server)  # sets Django up: import after it
    from django_celery_beat.models import (
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
        PeriodicTasks,
    )

    second = IntervalSchedule.objects.create(every=1, period="seconds")
    two = IntervalSchedule.objects.create(every=2, period="seconds")
    new_year = CrontabSchedule.objects.create(
        minute="0", hour="0", day_of_month="1", month_of_year="1", timezone="Europe/Berlin"
    )
    ticking = periodic_task("ticking", task=RECORD, interval=second, args='["ticking"]')
    once = periodic_task("once", task=RECORD, interval=second, one_off=True, args='["once"]')
    slow = periodic_task("slow", task=RECORD, interval=second, args='["slow", 2.5]')
    edited = periodic_task("edited-crontab", task=RECORD, crontab=new_year, args='["edited"]')
    enabled = periodic_task(
        "enabled-later", task=RECORD, crontab=new_year, enabled=False, args='["enabled"]'
    )
    # The stock DatabaseScheduler runs a crontab whose last_run_at is long past at once.
    PeriodicTask.objects.filter(pk__in=[edited.pk, enabled.pk]).update(last_run_at=LONG_AGO)

    env = platform_env(redis_url=redis_url, database_url=database_url)
    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv(APP, concurrency=4),
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

        def count(label: str) -> int:
            return len(_of(_runs(redis_client), label))

        try:
            wait_until(lambda: count("ticking") >= 4, timeout=60, message="4 ticking runs")
            # admin edits (saved with their change signal, as admin does, but only the
            # edited field: the test's instances hold stale run counts): ticking every
            # 2 s; the crontab gets another schedule; the disabled one is enabled
            ticking.interval = two
            ticking.save(update_fields=["interval"])
            edited.crontab = CrontabSchedule.objects.create(
                minute="0", hour="1", day_of_month="1", month_of_year="1", timezone="UTC"
            )
            edited.save(update_fields=["crontab"])
            enabled.enabled = True
            enabled.save(update_fields=["enabled"])
            PeriodicTask.objects.filter(pk=enabled.pk).update(last_run_at=LONG_AGO)
            edit_ms = int(time.time() * 1000)
            # the reload happens within beat's 5 s loop; then at least 3 even-second runs
            wait_until(
                lambda: (
                    sum(
                        1
                        for r in _of(_runs(redis_client), "ticking")
                        if r["point_ms"] > edit_ms + 6000
                    )
                    >= 3
                ),
                timeout=60,
                message="ticking runs after the edit",
            )
        except (TimeoutError, AssertionError) as exc:
            logs = "\n".join(b.log()[-2000:] for b in beats)
            raise AssertionError(f"{exc}\n{worker.log()[-3000:]}\n{logs}") from exc
        # Disable everything and let each replica reload before stopping it: a replica
        # stopped between recording a point and sending it would leave a count without
        # a run. The reload is logged at the start of a tick, after the previous one ended.
        once_row = PeriodicTask.objects.get(pk=once.pk)  # before everything is disabled
        offsets = [len(beat.log()) for beat in beats]
        PeriodicTask.objects.update(enabled=False)
        PeriodicTasks.update_changed()
        for beat, offset in zip(beats, offsets, strict=True):
            beat.wait_for_log("Schedule changed", timeout=60, after=offset)
        for beat in beats:
            beat.stop(timeout=30)
        ticking_rows = PeriodicTask.objects.get(pk=ticking.pk)
        # every trigger sent before beat stopped runs or expires: wait for the worker
        wait_until(
            lambda: count("ticking") >= ticking_rows.total_run_count,
            timeout=60,
            message="the worker ran every admitted ticking point",
        )
        worker.stop(timeout=30)
        beat_logs = [b.log() for b in beats]

    runs = _runs(redis_client)
    # each point at most once, across three replicas
    duplicates = [k for k, n in Counter((r["label"], r["point_ms"]) for r in runs).items() if n > 1]
    assert duplicates == [], duplicates
    assert all(r["point_ms"] is not None for r in runs), "a run without its lease header"
    # the edit is picked up: 1 s points before it, only even seconds once it is reloaded
    ticks = sorted(r["point_ms"] for r in _of(runs, "ticking"))
    assert any(p % 2000 == 1000 for p in ticks if p < edit_ms), ticks
    late = [p for p in ticks if p > edit_ms + 6000]
    assert len(late) >= 3 and all(p % 2000 == 0 for p in late), late
    # only the admitting replica writes the metadata: the count is the runs, not 3x
    assert ticking_rows.total_run_count == len(ticks)
    assert ticking_rows.last_run_at == datetime.fromtimestamp(ticks[-1] / 1000, UTC)
    # enabling or editing a task whose last_run_at is long past does not run it
    assert _of(runs, "edited") == [] and _of(runs, "enabled") == []
    # the one-off ran once and disabled itself
    assert len(_of(runs, "once")) == 1
    assert (once_row.enabled, once_row.total_run_count) == (False, 1)
    # the slow task held its lease while it ran: its runs never overlap
    slow_runs = sorted(
        (r for r in _of(runs, "slow") if not r.get("expired")), key=lambda r: r["start"]
    )
    assert len(slow_runs) >= 2
    for before, after in itertools.pairwise(slow_runs):
        assert after["start"] >= before["end"] - 0.05, (before, after)
    assert slow.pk and all("Traceback" not in log for log in beat_logs), beat_logs
