"""A warm stop (SIGTERM) of a real ``celery beat`` while a tick holds admitted points
whose triggers are not sent yet.

Beat is paused inside its first publish (:mod:`tests.support.publish_pause`, installed by
the ``paused_*`` apps: that pause is the one non-default part of the setup, so the test
can signal beat at that moment instead of hoping to hit it). The tick's points are then
admitted in Redis and none of their triggers is on the broker.

* A SIGTERM there lets the tick finish: every admitted point's trigger reaches the
  broker, then beat stops (exit 0) and admits nothing more.
* A second signal, or the stop timeout (``PLATFORM_BEAT_STOP_TIMEOUT_SECONDS``), stops
  beat at once: each admitted point whose trigger was not sent is logged by job and
  point, and its lease is given back, so the job is not blocked for its lease TTL.

Both schedulers are covered: ``LeaseScheduler`` (the default) and
``LeaseDatabaseScheduler`` (django-celery-beat).
"""

from __future__ import annotations

import base64
import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import redis

from platform_tasks.jobs.leases import JobLeases, resolve_namespace
from platform_tasks.keys import django_beat_namespace
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import PostgresServer, wait_until
from tests.support.django_beat import django_beat_database, periodic_task
from tests.support.processes import CELERY, CeleryProcess, celery_processes, platform_env

REPO = Path(__file__).resolve().parents[3]
JOBS_APP = "tests.apps.paused_jobs_app"
DJANGO_APP = "tests.apps.paused_django_beat_app"
SCHEDULER = "platform_tasks.contrib.django_celery_beat:LeaseDatabaseScheduler"
DEFERRED = "stop requested while a tick sends its triggers"

QUICK = """
from datetime import timedelta
from platform_tasks.jobs import define_job

def run(ctx):
    pass

define_job(handler=run, interval=timedelta(seconds=2))
"""
JOB_POINT = re.compile(r"job point job=(?P<job>\S+) point_ms=(?P<point>\d+) \S+ outcome=admitted")
TASK_POINT = re.compile(
    r"periodic task point task=\S+ id=(?P<pk>\d+) point_ms=(?P<point>\d+) "
    r"outcome=admitted"
)


def _messages(client: redis.Redis, queue: str) -> list[tuple[dict[str, Any], Any]]:
    """(headers, decoded body) of every message waiting in ``queue``."""
    found = []
    for raw in client.lrange(queue, 0, -1):
        message = json.loads(raw)
        body = message["body"]
        if message["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        found.append((message.get("headers") or {}, json.loads(body)))
    return found


def _queued_job_points(client: redis.Redis) -> set[tuple[str, int]]:
    return {
        (kwargs["job"], kwargs["point_ms"])
        for _, (_, kwargs, _) in _messages(client, "platform.jobs")
    }


def _queued_task_points(client: redis.Redis) -> set[tuple[str, int]]:
    points = set()
    for headers, _ in _messages(client, "default"):
        grant = headers.get("platform_lease")
        if grant:
            points.add((grant["job"], grant["point_ms"]))
    return points


class _PausedBeat:
    """A beat started with the pause; stop it the way a deploy does."""

    def __init__(self, argv: list[str], env: dict[str, str], tmp_path: Path) -> None:
        self.pause, self.release = tmp_path / "paused", tmp_path / "release"
        env = dict(env, E2E_PAUSE_FILE=str(self.pause), E2E_RELEASE_FILE=str(self.release))
        self.process = CeleryProcess(argv, env=env, cwd=REPO, log_path=tmp_path / "beat.log")

    def signal_inside_the_window(self, *, second: bool = False) -> None:
        process = self.process
        wait_until(self.pause.exists, timeout=90, message="beat paused in its first publish")
        process.signal(signal.SIGTERM)
        # The fixed beat says it defers the stop; an unfixed one just exits.
        wait_until(
            lambda: not process.running or DEFERRED in process.log(),
            timeout=30,
            message="beat deferring its stop, or exiting",
        )
        if second:
            process.signal(signal.SIGTERM)

    def wait_exit(self) -> int:
        assert self.process.popen is not None
        return self.process.popen.wait(timeout=60)


def _jobs_beat(tmp_path: Path, redis_url: str, extra: dict[str, str]) -> _PausedBeat:
    jobs_root = tmp_path / "jobs"
    jobs_root.mkdir()
    for i in range(6):
        (jobs_root / f"quick_{i}.py").write_text(QUICK)
    env = platform_env(
        redis_url=redis_url, database_url=None, extra={"PLATFORM_JOBS_DIR": str(jobs_root), **extra}
    )
    argv = [
        CELERY,
        "-A",
        JOBS_APP,
        "beat",
        "--loglevel",
        "INFO",
        "-s",
        str(tmp_path / "beat-schedule"),
    ]
    return _PausedBeat(argv, env, tmp_path)


def _job_leases(redis_url: str, client: redis.Redis, app_name: str) -> JobLeases:
    settings = PlatformSettings.build(redis_url=redis_url, profile="test")
    namespace, prefix = resolve_namespace(settings, app_name=app_name, mode="live")
    return JobLeases(client, namespace=namespace, prefix=prefix)


def test_sigterm_while_a_tick_sends_lets_it_send_every_admitted_trigger(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    beat = _jobs_beat(tmp_path, redis_url, {})
    with celery_processes() as started:
        started.append(beat.process.start())
        beat.signal_inside_the_window()
        beat.release.write_text("go")
        code = beat.wait_exit()
        log = beat.process.log()

    admitted = {(m["job"], int(m["point"])) for m in JOB_POINT.finditer(log)}
    assert admitted, log[-4000:]
    assert _queued_job_points(redis_client) == admitted, log[-4000:]
    assert code == 0, log[-4000:]
    assert "beat scheduler closed" in log, log[-4000:]
    assert "not sent" not in log, log[-4000:]


@pytest.mark.parametrize("how", ["second_signal", "stop_timeout"])
def test_stop_cut_short_logs_and_releases_each_unsent_point(
    how: str, tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    timeout = "60" if how == "second_signal" else "1"
    beat = _jobs_beat(tmp_path, redis_url, {"PLATFORM_BEAT_STOP_TIMEOUT_SECONDS": timeout})
    leases = _job_leases(redis_url, redis_client, "paused_jobs_app")
    with celery_processes() as started:
        started.append(beat.process.start())
        beat.signal_inside_the_window(second=how == "second_signal")
        code = beat.wait_exit()  # never released: only the signal or the timeout stops it
        log = beat.process.log()

    admitted = {(m["job"], int(m["point"])) for m in JOB_POINT.finditer(log)}
    assert admitted, log[-4000:]
    assert _queued_job_points(redis_client) == set(), log[-4000:]
    for job, point in admitted:
        assert f"trigger of {job} at point_ms={point} not sent" in log, (job, log[-4000:])
        assert leases.lease_holder(job) is None, job
        assert leases.marker(job) == point  # the point stays consumed: no second trigger
    assert code == 0, log[-4000:]


def _django_beat(
    tmp_path: Path, redis_url: str, postgres_server: PostgresServer, extra: dict[str, str]
) -> _PausedBeat:
    database_url = django_beat_database(postgres_server)  # sets Django up: import after it
    from django_celery_beat.models import IntervalSchedule

    every_two = IntervalSchedule.objects.create(every=2, period="seconds")
    for i in range(4):
        periodic_task(f"quick-{i}", task="tests.warm_stop.noop", interval=every_two)
    env = platform_env(redis_url=redis_url, database_url=database_url, extra=extra)
    argv = [CELERY, "-A", DJANGO_APP, "beat", "-S", SCHEDULER, "--loglevel", "INFO"]
    return _PausedBeat(argv, env, tmp_path)


def test_django_scheduler_sigterm_while_a_tick_sends_lets_it_finish(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, postgres_server: PostgresServer
) -> None:
    beat = _django_beat(tmp_path, redis_url, postgres_server, {})
    with celery_processes() as started:
        started.append(beat.process.start())
        beat.signal_inside_the_window()
        beat.release.write_text("go")
        code = beat.wait_exit()
        log = beat.process.log()

    admitted = {(f"periodic-task-{m['pk']}", int(m["point"])) for m in TASK_POINT.finditer(log)}
    assert admitted, log[-4000:]
    assert _queued_task_points(redis_client) == admitted, log[-4000:]
    assert code == 0, log[-4000:]


def test_django_scheduler_stop_timeout_logs_and_releases_each_unsent_point(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, postgres_server: PostgresServer
) -> None:
    beat = _django_beat(
        tmp_path, redis_url, postgres_server, {"PLATFORM_BEAT_STOP_TIMEOUT_SECONDS": "1"}
    )
    namespace = django_beat_namespace(app_name="paused_django_beat_app", profile="test")
    leases = JobLeases(redis_client, namespace=namespace, prefix="")
    with celery_processes() as started:
        started.append(beat.process.start())
        beat.signal_inside_the_window()
        code = beat.wait_exit()
        log = beat.process.log()

    admitted = {(f"periodic-task-{m['pk']}", int(m["point"])) for m in TASK_POINT.finditer(log)}
    assert admitted, log[-4000:]
    assert _queued_task_points(redis_client) == set(), log[-4000:]
    for job, point in admitted:
        assert f"trigger of {job} at point_ms={point} not sent" in log, (job, log[-4000:])
        assert leases.lease_holder(job) is None, job
    assert code == 0, log[-4000:]
