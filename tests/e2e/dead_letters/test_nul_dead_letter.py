"""A consumed envelope holding NUL becomes a stored dead letter; the next job still applies.

``publish`` refuses NUL, so the message is sent the way another producer could send it:
``send_task`` with the envelope as its argument. A real prefork worker of the consumer
app (one pool process, so the next job runs in the same process and on the same
connection) dead-letters it as poison, and the row can be written although PostgreSQL
stores NUL in neither ``text`` nor ``jsonb``.
"""

from __future__ import annotations

from pathlib import Path

import psycopg2

from platform_tasks import QueuePort, create_app
from platform_tasks.dead_letters.dead_letter import ESCAPED_KEY
from platform_tasks.envelope import uuid7
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import QUEUE, WORK_TABLE_SQL
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

REPO_ROOT = Path(__file__).resolve().parents[3]
TASK = "tests.consumer.apply"


def _rows(database_url: str, sql: str) -> list[tuple[object, ...]]:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


def test_nul_envelope_is_dead_lettered_and_the_next_job_applies(
    redis_url: str, database_url: str, tmp_path: Path
) -> None:
    _rows(database_url, WORK_TABLE_SQL)
    settings = PlatformSettings.build(
        redis_url=redis_url, database_url=database_url, profile="test"
    )
    app = create_app("nul_producer", settings=settings)
    port = QueuePort(app)
    poison_id, good_id = str(uuid7()), str(uuid7())
    poison = {
        "job_id": poison_id,
        "tenant_id": "t1",
        "correlation_id": "corr\x00-1",
        "kind": TASK,
        "data": {"key": "a\x00b"},
    }
    try:
        app.send_task(TASK, args=[poison], task_id=poison_id, queue=QUEUE)
        port.publish(
            QUEUE,
            {"job_id": good_id, "tenant_id": "t1", "kind": TASK, "data": {"key": "after-the-nul"}},
        )
    finally:
        port.close()
        app.close()
    env = platform_env(redis_url=redis_url, database_url=database_url)
    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv("tests.apps.consumer_app", concurrency=1),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        ).start()
        started.append(worker)
        wait_until(
            lambda: _rows(database_url, "SELECT count(*) FROM public.consumer_work")[0][0] >= 1,
            timeout=90,
            message="the job after the NUL one to apply",
        )
        wait_until(
            lambda: _rows(database_url, "SELECT count(*) FROM core.dead_letters")[0][0] >= 1,
            timeout=90,
            message="the NUL job's dead letter",
        )
    [(job_id, reason, correlation_id, payload)] = _rows(
        database_url,
        "SELECT job_id::text, reason, correlation_id, payload FROM core.dead_letters",
    )
    assert job_id == poison_id and reason == "poison"
    assert correlation_id == "corr\\u0000-1"
    assert payload["data"] == {"key": "a\\u0000b"}
    assert "data.key (NUL)" in payload[ESCAPED_KEY]
    assert _rows(database_url, "SELECT job_id::text, key FROM public.consumer_work") == [
        (good_id, "after-the-nul")
    ]
