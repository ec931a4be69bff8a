"""A worker of a plain ``Celery()`` app that does not renew leases, receiving triggers of
``LeaseDatabaseScheduler``: it says so once, naming the line to add, and runs the tasks.

The worker is started as the README starts one (``celery -A app worker --loglevel INFO``);
the triggers are published on the real broker with the lease header exactly as the
scheduler sends it.
"""

from __future__ import annotations

from pathlib import Path

import redis
from celery import Celery

from platform_tasks.contrib.beat_leases import LEASE_HEADER, LeaseGrant
from platform_tasks.testing.servers import wait_until
from tests.conftest import REPO_ROOT
from tests.support.processes import CELERY, CeleryProcess, celery_processes, platform_env

APP = "tests.apps.plain_celery_lease_app"
RUNS = "test:plain-lease:runs"
WARNING = "does not renew or release those leases"


def _grant(point_ms: int) -> LeaseGrant:
    return LeaseGrant(
        "platform:plain:test:django-celery-beat",
        "",
        "periodic-task-1",
        f"beat:{point_ms}",
        60_000,
        point_ms,
    )


def test_plain_app_worker_names_the_missing_line_once(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    env = platform_env(redis_url=redis_url, database_url=None)
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
        for n, point_ms in enumerate((1_000, 2_000, 3_000)):
            sender.send_task(
                "tests.plain_lease.record",
                args=[f"run-{n}"],
                headers={LEASE_HEADER: _grant(point_ms).to_header()},
            )
        try:
            wait_until(lambda: redis_client.llen(RUNS) == 3, timeout=60, message="three runs")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{worker.log()[-3000:]}") from exc
        worker.stop(timeout=30)
        log = worker.log()
    sender.close()
    assert log.count(WARNING) == 1, log[-3000:]
    line = next(line for line in log.splitlines() if WARNING in line)
    assert "install_lease_renewal(app)" in line and "tests.plain_lease.record" in line, line
    assert "WARNING" in line, line
