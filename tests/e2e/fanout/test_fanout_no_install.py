"""``fan_out`` from a scheduled job of an app made by ``create_app`` alone (no ``install``).

``celery -A tests.apps.fanout_plain_app worker --loglevel INFO`` and ``... beat --loglevel
INFO`` as the README starts them (no ``-Q``), with ``PLATFORM_JOBS_DIR`` pointing at a
``beat_schedules/`` folder holding one job whose handler calls ``fan_out``, exactly as
the contract shows it. The points come through the real scheduler path: beat admits
them, the worker runs the handler, the fan-out consumer publishes the tenants' jobs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis

from platform_tasks.testing.servers import wait_until
from tests.apps.fanout_plain_app import KIND, WORK_QUEUE
from tests.conftest import REPO_ROOT
from tests.support.fanout import make_tenants, sql
from tests.support.processes import CELERY, CeleryProcess, celery_processes, platform_env

__all__ = ["make_tenants"]  # fixtures

JOB_FILE = f"""
from datetime import timedelta

from platform_tasks.fanout import fan_out
from platform_tasks.jobs import define_job


def run(ctx):
    fan_out(ctx, queue={WORK_QUEUE!r}, kind={KIND!r})


job = define_job(handler=run, interval=timedelta(seconds=2))
"""

APP = "tests.apps.fanout_plain_app"


def _finished_points(database_url: str, tenants: int) -> list[str]:
    rows = sql(
        database_url,
        "SELECT point FROM public.fanout_applied GROUP BY point "
        "HAVING count(DISTINCT tenant_id) = %s",
        (tenants,),
    )
    return [row[0] for row in rows]


def test_fan_out_from_a_job_of_a_create_app_app_without_install_applies_each_tenant_once(
    redis_url: str, database_url: str, make_tenants: Callable[[int], int], tmp_path: Path
) -> None:
    tenants = make_tenants(50)
    jobs = tmp_path / "beat_schedules"
    jobs.mkdir()
    (jobs / "tenant_fanout.py").write_text(JOB_FILE)
    env = platform_env(
        redis_url=redis_url, database_url=database_url, extra={"PLATFORM_JOBS_DIR": str(jobs)}
    )
    with celery_processes() as started:
        worker = CeleryProcess(
            [CELERY, "-A", APP, "worker", "--loglevel", "INFO"],
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        worker.wait_for_log("ready.", timeout=90)
        beat = CeleryProcess(
            [CELERY, "-A", APP, "beat", "--loglevel", "INFO"],
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "beat.log",
        ).start()
        started.append(beat)

        def one_point_applied_or_failed() -> bool:
            return "job tenant_fanout failed" in worker.log() or bool(
                _finished_points(database_url, tenants)
            )

        wait_until(
            one_point_applied_or_failed,
            timeout=120,
            message="the 50 tenant jobs of one point applied",
        )
        assert "job tenant_fanout failed" not in worker.log(), worker.log()[-3000:]
        beat.stop()
        # every fan-out a point started finishes, and its queue drains
        wait_until(
            lambda: (
                sql(
                    database_url,
                    "SELECT count(*) FROM core.fanout_progress WHERE finished_at IS NULL",
                )
                == [(0,)]
            ),
            timeout=120,
            message="every started fan-out finished",
        )
        client = redis.Redis.from_url(redis_url)
        wait_until(
            lambda: client.llen(WORK_QUEUE) == 0, timeout=120, message="tenant queue drained"
        )
        wait_until(
            lambda: (
                len(_finished_points(database_url, tenants))
                == len(sql(database_url, "SELECT DISTINCT point FROM public.fanout_applied"))
            ),
            timeout=120,
            message="every point's 50 tenant jobs applied",
        )
        client.close()
        log = worker.log()
    points = sql(
        database_url,
        "SELECT point, count(*), count(DISTINCT tenant_id) "
        "FROM public.fanout_applied GROUP BY point",
    )
    assert points and all(count == distinct == tenants for _, count, distinct in points), points
    assert sql(database_url, "SELECT count(*) FROM core.fanout_progress") == [(len(points),)]
    assert sql(database_url, "SELECT count(*) FROM core.dead_letters") == [(0,)]
    assert "does not consume platform queue" not in log
