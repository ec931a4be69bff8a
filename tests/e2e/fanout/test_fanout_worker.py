"""Fan-out through real ``celery worker`` processes: duplicate triggers, dead letters and
replay, start-up validation of the tenant source (queues named with ``-Q``: see
``tests/support/fanout.py``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import redis

from platform_tasks import QueuePort
from platform_tasks.fanout import fan_out, fan_out_job_id
from platform_tasks.testing.servers import wait_until
from tests.apps.fanout_app import GATED_TENANTS_QUERY, KIND, WORK_QUEUE
from tests.conftest import REPO_ROOT
from tests.support.fanout import (
    JOB,
    POINT,
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


def test_a_trigger_delivered_twice_fans_out_once(
    redis_url: str,
    database_url: str,
    make_tenants: Callable[[int], int],
    port: QueuePort,
    tmp_path: Path,
) -> None:
    tenants = make_tenants(200)
    env = platform_env(
        redis_url=redis_url, database_url=database_url, extra={"PLATFORM_JOBS_ENABLED": "false"}
    )
    with celery_processes() as started:
        worker = fanout_worker(env, tmp_path / "w.log", "w").start()
        started.append(worker)
        worker.wait_for_log("ready.")
        # the handler of a duplicated trigger runs twice: two fan_out calls, one job id
        first = fan_out(ctx(), queue=WORK_QUEUE, kind=KIND, port=port)
        second = fan_out(ctx(), queue=WORK_QUEUE, kind=KIND, port=port)
        assert first == second == fan_out_job_id(JOB, POINT, KIND)
        wait_until(
            lambda: applied(database_url) >= tenants,
            timeout=120,
            message="every tenant job applied",
        )
        worker.wait_for_log(f"platform.fanout[{first}]", timeout=30)
        wait_until(
            lambda: worker.log().count("duplicate delivery skipped") >= 1,
            timeout=60,
            message="the second fan-out delivery skipped as a duplicate",
        )
        wait_until(
            lambda: redis.Redis.from_url(redis_url).llen(WORK_QUEUE) == 0,
            timeout=60,
            message="work queue drained",
        )
    assert worker.log().count("published 200 tenant(s)") == 1
    assert progress(database_url) == (200, True)
    assert_each_tenant_applied_once(database_url, tenants)


def test_a_failing_fan_out_is_a_dead_letter_and_its_replay_resumes(
    redis_url: str,
    database_url: str,
    make_tenants: Callable[[int], int],
    port: QueuePort,
    tmp_path: Path,
) -> None:
    """Needs PLATFORM_TENANTS_QUERY: the gated query fails at ``t-0500`` while
    ``fanout_fail`` has a row; the test app gives ``platform.fanout`` 3 attempts, 1-2 s apart."""
    tenants = make_tenants(600)
    sql(database_url, "INSERT INTO public.fanout_fail VALUES ('fail at t-0500')")
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            "PLATFORM_TENANTS_QUERY": GATED_TENANTS_QUERY,
            "PLATFORM_FANOUT_BATCH_SIZE": "50",
            "PLATFORM_JOBS_ENABLED": "false",
            "PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1",
        },
    )
    with celery_processes() as started:
        worker = fanout_worker(env, tmp_path / "w.log", "w").start()
        started.append(worker)
        worker.wait_for_log("ready.")
        fan_id = fan_out(ctx(), queue=WORK_QUEUE, kind=KIND, port=port)
        wait_until(
            lambda: (
                sql(
                    database_url,
                    "SELECT attempts FROM core.dead_letters WHERE job_id = %s",
                    (str(fan_id),),
                )
                == [(3,)]
            ),
            timeout=90,
            message="the fan-out dead-lettered after 3 attempts",
        )
        assert progress(database_url) == (500, False)
        sql(database_url, "DELETE FROM public.fanout_fail")
        replay = subprocess.run(
            [
                str(Path(sys.executable).parent / "platform-tasks"),
                "dead-letters",
                "replay",
                "--all",
                "--app",
                "tests.apps.fanout_app:app",
            ],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert replay.returncode == 0, replay.stdout + replay.stderr
        wait_until(
            lambda: progress(database_url) == (600, True),
            timeout=90,
            message="the replayed fan-out finished",
        )
        wait_until(
            lambda: applied(database_url) >= tenants,
            timeout=120,
            message="every tenant job applied",
        )
        wait_until(
            lambda: redis.Redis.from_url(redis_url).llen(WORK_QUEUE) == 0,
            timeout=60,
            message="work queue drained",
        )
        log = worker.log()
    assert log.count("resuming after tenant 't-0499'") == 3  # two retries and the replay
    assert "published 100 tenant(s)" in log
    assert_each_tenant_applied_once(database_url, tenants)
    assert sql(database_url, "SELECT status FROM core.dead_letters") == [("replayed",)]


def test_a_worker_with_a_bad_tenants_query_refuses_to_start(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={
            "PLATFORM_TENANTS_QUERY": "SELECT id AS tenant, 'nightly' AS freshness_tier FROM "
            "(VALUES (1)) AS t(id)",
            "PLATFORM_JOBS_ENABLED": "false",
        },
    )
    with celery_processes() as started:
        worker = fanout_worker(env, tmp_path / "w.log", "w").start()
        started.append(worker)
        assert worker.popen is not None
        worker.popen.wait(timeout=90)
        assert worker.popen.returncode != 0
    assert (
        "PLATFORM_TENANTS_QUERY: must return the columns tenant_id, freshness_tier; "
        "missing tenant_id (it returns: tenant, freshness_tier)"
    ) in worker.log()
    assert " ready." not in worker.log()
