"""A worker whose Redis (broker and platform Redis) is demoted to a replica and promoted back.

Two real ``redis-server`` processes. The worker's URL names server A. A is made a replica
of B (``REPLICAOF``): every write the worker sends A is answered ``READONLY``. A job is
published to B, the primary now, and reaches A by replication; then A is promoted again
(``REPLICAOF NO ONE``), as after a failover back. The worker must apply the job within a
deadline instead of waiting on its old connections for ever.
"""

from __future__ import annotations

from pathlib import Path

import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.envelope import uuid7
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import QUEUE, WORK_TABLE_SQL
from tests.conftest import REPO_ROOT, ServerFactory
from tests.support.database import query
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv


def applied(database_url: str, job_id: str) -> int:
    rows = query(
        database_url, "SELECT count(*) FROM public.consumer_work WHERE job_id = %s", job_id
    )
    return int(rows[0][0])


def publish(redis_url: str, database_url: str, key: str) -> str:
    settings = PlatformSettings.build(
        redis_url=redis_url, database_url=database_url, profile="test"
    )
    app = create_app("failover_producer", settings=settings)
    port = QueuePort(app)
    try:
        envelope = {
            "job_id": str(uuid7()),
            "tenant_id": "t1",
            "kind": "tests.consumer.apply",
            "data": {"key": key},
        }
        job_id = port.publish(QUEUE, envelope)
    finally:
        port.close()
        app.close()
    return str(job_id)


def test_a_worker_applies_jobs_after_its_redis_is_demoted_and_promoted_again(
    server_factory: ServerFactory, database_url: str, tmp_path: Path
) -> None:
    query(database_url, WORK_TABLE_SQL)
    query(database_url, "TRUNCATE public.consumer_work")
    a = server_factory.redis()
    b = server_factory.redis()
    client_a = redis.Redis.from_url(a.url)
    env = platform_env(redis_url=a.url, database_url=database_url)
    with celery_processes() as started:
        worker = CeleryProcess(
            worker_argv("tests.apps.consumer_app", concurrency=1),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
        )
        started.append(worker.start())
        worker.wait_for_log("ready.", timeout=60)
        before = publish(a.url, database_url, "before")
        wait_until(
            lambda: applied(database_url, before) == 1,
            timeout=60,
            message="job applied before the failover",
        )

        client_a.execute_command("REPLICAOF", "127.0.0.1", str(b.port))
        wait_until(
            lambda: client_a.info("replication").get("master_link_status") == "up",
            timeout=30,
            message="A replicates B",
        )
        after = publish(b.url, database_url, "after")
        wait_until(lambda: client_a.llen(QUEUE) == 1, timeout=30, message="the job replicated to A")
        worker.wait_for_log("ReadOnlyError", timeout=30)
        client_a.execute_command("REPLICAOF", "NO", "ONE")
        wait_until(
            lambda: applied(database_url, after) == 1,
            timeout=60,
            message="job applied after A was promoted again",
        )
        assert worker.running
    client_a.close()
