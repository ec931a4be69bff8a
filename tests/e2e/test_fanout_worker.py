"""Fan-out through real ``celery worker`` processes: SIGKILL mid-publish, duplicate triggers.

The workers are started as the README says (``celery -A app worker``) with the test app
``tests.apps.fanout_app``, whose default queue is its tenant consumer's queue. They name
their queues with ``-Q`` (the tenant queue and ``platform.fanout``): on Celery 5.7 the
worker-queues step takes every worker for one started with ``-Q`` (``Queues.consume_from``
is never the ``Queues`` object itself there), so without ``-Q`` it would not add
``platform.fanout``. The queues named are exactly the ones ``platform_queues(app)`` lists.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
import pytest
import redis

from platform_tasks import QueuePort
from platform_tasks.fanout import FANOUT_QUEUE, fan_out, fan_out_job_id
from platform_tasks.harness import wait_until
from platform_tasks.jobs.runner import JobContext
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing import create_test_app
from tests.apps.fanout_app import GATED_TENANTS_QUERY, KIND, SCHEMA_SQL, WORK_QUEUE
from tests.conftest import REPO_ROOT
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

JOB = "maintenance.e2e"
POINT = datetime(2025, 9, 1, 4, 0, tzinfo=UTC)


def _sql(database_url: str, statement: str, params: tuple[object, ...] = ()) -> list[tuple]:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement, params or None)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


@pytest.fixture
def tenants(database_url: str) -> int:
    _sql(database_url, SCHEMA_SQL)
    _sql(database_url, "TRUNCATE public.fanout_applied, public.fanout_hold, public.fanout_fail")
    _sql(database_url, "INSERT INTO core.tenants (tenant_id, freshness_tier) "
                       "SELECT 't-' || lpad(n::text, 4, '0'), '1h' "
                       "FROM generate_series(0, 999) AS n")  # fmt: skip
    return 1000


@pytest.fixture
def port(redis_url: str, database_url: str):  # type: ignore[no-untyped-def]
    settings = PlatformSettings.build(redis_url=redis_url, database_url=database_url,
                                      profile="test")  # fmt: skip
    queue_port = QueuePort(create_test_app("fanout_e2e_publisher", settings=settings))
    yield queue_port
    queue_port.close()


def ctx() -> JobContext:
    return JobContext(name=JOB, scheduled_for=POINT, cancel_requested=threading.Event(),
                      logger=logging.getLogger("test"))  # fmt: skip


def _worker(env: dict[str, str], log: Path, name: str) -> CeleryProcess:
    argv = worker_argv(
        "tests.apps.fanout_app", hostname=f"{name}@%h", queues=f"{WORK_QUEUE},{FANOUT_QUEUE}"
    )
    return CeleryProcess(argv,
                         env=env, cwd=REPO_ROOT, log_path=log)  # fmt: skip


def _applied(database_url: str) -> int:
    return int(_sql(database_url, "SELECT count(*) FROM public.fanout_applied")[0][0])


def _progress(database_url: str) -> tuple[int, bool] | None:
    rows = _sql(database_url, "SELECT published, finished_at IS NOT NULL FROM core.fanout_progress")
    return (int(rows[0][0]), bool(rows[0][1])) if rows else None


def _assert_each_tenant_applied_once(database_url: str, expected: int) -> None:
    assert _applied(database_url) == expected
    twice = _sql(database_url, "SELECT tenant_id, count(*) FROM public.fanout_applied "
                               "GROUP BY tenant_id HAVING count(*) > 1")  # fmt: skip
    assert twice == []
    [(tenants, points)] = _sql(
        database_url,
        "SELECT count(DISTINCT tenant_id), count(DISTINCT point) FROM public.fanout_applied",
    )
    assert (tenants, points) == (expected, 1)


def test_fan_out_killed_mid_publish_and_redelivered_applies_every_tenant_once(
    redis_url: str, database_url: str, tenants: int, port: QueuePort, tmp_path: Path
) -> None:
    """Needs PLATFORM_TENANTS_QUERY: the gated query holds the stream before ``t-0500``
    while ``fanout_hold`` has a row, so the kill lands mid-publish on purpose, not by luck."""
    _sql(database_url, "INSERT INTO public.fanout_hold VALUES ('hold the stream at t-0500')")
    env = platform_env(redis_url=redis_url, database_url=database_url, extra={
        "PLATFORM_TENANTS_QUERY": GATED_TENANTS_QUERY,
        "PLATFORM_FANOUT_BATCH_SIZE": "50",
        "PLATFORM_VISIBILITY_TIMEOUT_SECONDS": "5",
        "PLATFORM_JOBS_ENABLED": "false",
    })  # fmt: skip
    with celery_processes() as started:
        first = _worker(env, tmp_path / "w1.log", "w1").start()
        started.append(first)
        first.wait_for_log("ready.")
        fan_id = fan_out(ctx(), queue=WORK_QUEUE, kind=KIND, port=port)
        wait_until(lambda: _progress(database_url) == (500, False), timeout=60,
                   message="the fan-out published 500 tenants and waits at t-0500")  # fmt: skip
        first.kill_group()
        _sql(database_url, "DELETE FROM public.fanout_hold")
        second = _worker(env, tmp_path / "w2.log", "w2").start()
        started.append(second)
        wait_until(lambda: _progress(database_url) == (1000, True), timeout=90,
                   message="the redelivered fan-out finished")  # fmt: skip
        wait_until(lambda: _applied(database_url) >= tenants, timeout=120,
                   message="every tenant job applied")  # fmt: skip
        second.wait_for_log("resuming after tenant 't-0499'")
        assert "published 500 tenant(s)" in second.log()
        # let redeliveries of jobs the killed worker held arrive and be skipped
        wait_until(lambda: redis.Redis.from_url(redis_url).llen(WORK_QUEUE) == 0, timeout=60,
                   message="work queue drained")  # fmt: skip
    _assert_each_tenant_applied_once(database_url, tenants)
    rows = _sql(database_url, "SELECT count(*) FROM core.processed_jobs WHERE job_id = %s",
                (str(fan_id),))  # fmt: skip
    assert rows == [(1,)]
    assert _sql(database_url, "SELECT count(*) FROM core.dead_letters") == [(0,)]


def test_a_trigger_delivered_twice_fans_out_once(
    redis_url: str, database_url: str, tenants: int, port: QueuePort, tmp_path: Path
) -> None:
    env = platform_env(redis_url=redis_url, database_url=database_url,
                       extra={"PLATFORM_JOBS_ENABLED": "false"})  # fmt: skip
    with celery_processes() as started:
        worker = _worker(env, tmp_path / "w.log", "w").start()
        started.append(worker)
        worker.wait_for_log("ready.")
        # the handler of a duplicated trigger runs twice: two fan_out calls, one job id
        first = fan_out(ctx(), queue=WORK_QUEUE, kind=KIND, port=port)
        second = fan_out(ctx(), queue=WORK_QUEUE, kind=KIND, port=port)
        assert first == second == fan_out_job_id(JOB, POINT, KIND)
        wait_until(lambda: _applied(database_url) >= tenants, timeout=120,
                   message="every tenant job applied")  # fmt: skip
        worker.wait_for_log(f"platform.fanout[{first}]", timeout=30)
        wait_until(lambda: worker.log().count("duplicate delivery skipped") >= 1, timeout=60,
                   message="the second fan-out delivery skipped as a duplicate")  # fmt: skip
        wait_until(lambda: redis.Redis.from_url(redis_url).llen(WORK_QUEUE) == 0, timeout=60,
                   message="work queue drained")  # fmt: skip
    assert worker.log().count("published 1000 tenant(s)") == 1
    assert _progress(database_url) == (1000, True)
    _assert_each_tenant_applied_once(database_url, tenants)


def test_a_failing_fan_out_is_a_dead_letter_and_its_replay_resumes(
    redis_url: str, database_url: str, tenants: int, port: QueuePort, tmp_path: Path
) -> None:
    """Needs PLATFORM_TENANTS_QUERY: the gated query fails at ``t-0500`` while
    ``fanout_fail`` has a row; the test app gives ``platform.fanout`` 3 attempts, 1-2 s apart."""
    _sql(database_url, "INSERT INTO public.fanout_fail VALUES ('fail at t-0500')")
    env = platform_env(redis_url=redis_url, database_url=database_url, extra={
        "PLATFORM_TENANTS_QUERY": GATED_TENANTS_QUERY,
        "PLATFORM_FANOUT_BATCH_SIZE": "50",
        "PLATFORM_JOBS_ENABLED": "false",
        "PLATFORM_DELAY_POLL_INTERVAL_SECONDS": "0.1",
    })  # fmt: skip
    with celery_processes() as started:
        worker = _worker(env, tmp_path / "w.log", "w").start()
        started.append(worker)
        worker.wait_for_log("ready.")
        fan_id = fan_out(ctx(), queue=WORK_QUEUE, kind=KIND, port=port)
        wait_until(lambda: _sql(database_url, "SELECT attempts FROM core.dead_letters "
                                              "WHERE job_id = %s", (str(fan_id),)) == [(3,)],
                   timeout=90, message="the fan-out dead-lettered after 3 attempts")  # fmt: skip
        assert _progress(database_url) == (500, False)
        _sql(database_url, "DELETE FROM public.fanout_fail")
        replay = subprocess.run(
            [str(Path(sys.executable).parent / "platform-tasks"), "dead-letters", "replay",
             "--all", "--app", "tests.apps.fanout_app:app"],
            env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert replay.returncode == 0, replay.stdout + replay.stderr
        wait_until(lambda: _progress(database_url) == (1000, True), timeout=90,
                   message="the replayed fan-out finished")  # fmt: skip
        wait_until(lambda: _applied(database_url) >= tenants, timeout=120,
                   message="every tenant job applied")  # fmt: skip
        wait_until(lambda: redis.Redis.from_url(redis_url).llen(WORK_QUEUE) == 0, timeout=60,
                   message="work queue drained")  # fmt: skip
        log = worker.log()
    assert log.count("resuming after tenant 't-0499'") == 3  # two retries and the replay
    assert "published 500 tenant(s)" in log
    _assert_each_tenant_applied_once(database_url, tenants)
    assert _sql(database_url, "SELECT status FROM core.dead_letters") == [("replayed",)]


def test_a_worker_with_a_bad_tenants_query_refuses_to_start(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    env = platform_env(redis_url=redis_url, database_url=database_url, extra={
        "PLATFORM_TENANTS_QUERY": "SELECT id AS tenant, 'nightly' AS freshness_tier FROM "
                                  "(VALUES (1)) AS t(id)",
        "PLATFORM_JOBS_ENABLED": "false",
    })  # fmt: skip
    with celery_processes() as started:
        worker = _worker(env, tmp_path / "w.log", "w").start()
        started.append(worker)
        assert worker.popen is not None
        worker.popen.wait(timeout=90)
        assert worker.popen.returncode != 0
    assert (
        "PLATFORM_TENANTS_QUERY: must return the columns tenant_id, freshness_tier; "
        "missing tenant_id (it returns: tenant, freshness_tier)"
    ) in worker.log()
    assert " ready." not in worker.log()
