"""A task running longer than the visibility timeout runs once; a crash still redelivers.

Two real ``celery worker`` processes (prefork ``-c 2``, acks late) share a broker with
``PLATFORM_VISIBILITY_TIMEOUT_SECONDS=5`` (the setting's minimum) so that every process
but the busy one is free to take a redelivered copy. A 15 s task must run exactly once:
the worker holding it keeps its unacked record fresh. Then the worker running a second
long task is SIGKILLed (with its pool) and the other worker must run that job again,
about one visibility timeout later (that second run is short: what is checked is that
it comes back, on the other worker, and completes once).

Non-default setup (why): the short visibility timeout, so redelivery happens within the
test's budget; two workers on one host, so a redelivered copy always finds a process.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from platform_tasks import create_app
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.support.processes import CeleryProcess, platform_env, worker_argv

REPO_ROOT = Path(__file__).resolve().parents[4]
VISIBILITY_SECONDS = 5
# Written by tests/integration/brokers/transport/worker_app.py.
APPLIED_KEY = "test:transport:applied"
STARTED_KEY = "test:transport:started"
RUNNER_KEY = "test:transport:runner"


def _count(client: redis.Redis, key: str, n: int) -> int:
    return int(client.hget(key, str(n)) or 0)


@pytest.mark.timeout(240)
def test_long_task_runs_once_and_comes_back_only_after_a_crash(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    env = platform_env(
        redis_url=redis_url,
        database_url=None,
        extra={"PLATFORM_VISIBILITY_TIMEOUT_SECONDS": str(VISIBILITY_SECONDS)},
    )
    workers = {
        name: CeleryProcess(
            worker_argv("tests.integration.brokers.transport.worker_app", hostname=name),
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / f"{name}.log",
        ).start()
        for name in ("long1@localhost", "long2@localhost")
    }
    settings = PlatformSettings.build(redis_url=redis_url, profile="test")
    app = create_app("long-publisher", settings=settings, task_send_sent_event=False)
    try:
        for worker in workers.values():
            worker.wait_for_log("ready.", timeout=90)

        # 1. Three visibility timeouts long: one run, no second copy anywhere.
        app.send_task("transport_faults.count", args=[0, 15.0])
        wait_until(
            lambda: _count(redis_client, APPLIED_KEY, 0) == 1,
            timeout=90,
            message="the long job to finish",
        )
        assert _count(redis_client, STARTED_KEY, 0) == 1, "a second copy of the job started"
        wait_until(
            lambda: redis_client.hlen("unacked") == 0, timeout=30, message="the long job's ack"
        )
        assert redis_client.llen("default") == 0

        # 2. The worker running a long job dies: the job comes back on the other one.
        app.send_task("transport_faults.count", args=[1, 10.0, 0.5])
        wait_until(
            lambda: _count(redis_client, STARTED_KEY, 1) == 1,
            timeout=60,
            message="the second long job to start",
        )
        victim = redis_client.hget(RUNNER_KEY, "1").decode()
        workers[victim].kill_group()
        killed_at = time.monotonic()
        wait_until(
            lambda: _count(redis_client, STARTED_KEY, 1) == 2,
            timeout=60,
            message="the killed worker's job to be redelivered",
        )
        back_after = time.monotonic() - killed_at
        survivor = next(name for name in workers if name != victim)
        assert redis_client.hget(RUNNER_KEY, "1").decode() == survivor
        wait_until(
            lambda: _count(redis_client, APPLIED_KEY, 1) == 1,
            timeout=60,
            message="the redelivered job to finish",
        )
        print(
            f"redelivered {back_after:.1f}s after the SIGKILL "
            f"(visibility timeout {VISIBILITY_SECONDS}s)"
        )
    finally:
        for worker in workers.values():
            worker.stop(timeout=20)
