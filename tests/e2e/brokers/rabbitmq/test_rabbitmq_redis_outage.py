"""On RabbitMQ, an outage of the platform's Redis holds only the deliveries that need it.

RabbitMQ sets ``redelivered`` itself on every message it delivered before, so a first
delivery whose claim finds no delivery mark has nothing in Redis to read: it is applied
while Redis is down. A job whose attempt fails needs Redis to count the failure: its
delivery waits unacked (the handler is not run again meanwhile) and is retried once
Redis is back. The platform's Redis here is a server of the test's own, so stopping it
leaves the session's Redis (which counts handler runs) running.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import RedisServer, wait_until
from tests.apps.consumer_app import QUEUE, WORK_TABLE_SQL, runs_key
from tests.conftest import REPO_ROOT
from tests.e2e.brokers.rabbitmq.conftest import applied
from tests.support.database import query
from tests.support.processes import celery_processes, platform_env, start_worker


@pytest.fixture
def platform_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "platform-redis").start()
    try:
        yield server
    finally:
        server.stop()


def job(key: str, **data: Any) -> dict[str, Any]:
    return {"tenant_id": "t1", "kind": "tests.consumer.apply", "data": {"key": key, **data}}


def test_healthy_first_deliveries_are_applied_and_a_failure_waits_while_redis_is_down(
    rabbitmq_url: str,
    redis_url: str,
    database_url: str,
    platform_redis: RedisServer,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    query(database_url, WORK_TABLE_SQL)
    query(database_url, "TRUNCATE public.consumer_work")
    settings = PlatformSettings.build(
        broker_url=rabbitmq_url,
        redis_url=platform_redis.url,
        database_url=database_url,
        profile="test",
    )
    env = platform_env(
        redis_url=platform_redis.url,
        database_url=database_url,
        extra={
            "PLATFORM_BROKER_URL": rabbitmq_url,
            "CONSUMER_TEST_RUNS_REDIS_URL": redis_url,
        },
    )
    producer = create_app(
        "rabbitmq_redis_outage_producer", settings=settings, task_default_queue=QUEUE
    )
    port = QueuePort(producer)
    with celery_processes() as started:
        worker = start_worker(
            started,
            "tests.apps.consumer_app",
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
            ready_timeout=120,
        )
        try:
            first = port.publish(QUEUE, job("before"))
            wait_until(
                lambda: applied(database_url, first) == 1, timeout=60, message="first job applied"
            )
            platform_redis.stop()
            healthy = port.publish(QUEUE, job("healthy during the outage"))
            wait_until(
                lambda: applied(database_url, healthy) == 1,
                timeout=60,
                message="a healthy first delivery applied while Redis is down",
            )
            failing = port.publish(QUEUE, job("fails once", fail_times=1))
            wait_until(
                lambda: int(redis_client.get(runs_key(failing)) or 0) >= 1,
                timeout=60,
                message="the failing job's first attempt ran",
            )
            worker.wait_for_log("database or Redis unavailable (", timeout=60)
            # it keeps waiting: a second look at Redis is refused too, the handler not rerun
            wait_until(
                lambda: worker.log().count("database or Redis unavailable (") >= 2,
                timeout=60,
                message="the failed job still waiting for Redis",
            )
            assert applied(database_url, failing) == 0
            assert int(redis_client.get(runs_key(failing)) or 0) == 1
            assert query(database_url, "SELECT count(*) FROM core.dead_letters") == [(0,)]
            platform_redis.start()
            wait_until(
                lambda: applied(database_url, failing) == 1,
                timeout=90,
                interval=0.2,
                message="the failed job applied after Redis came back",
            )
        except (TimeoutError, AssertionError) as exc:
            raise AssertionError(f"{exc}\n--- worker log ---\n{worker.log()[-6000:]}") from exc
        finally:
            port.close()
            producer.close()
    assert int(redis_client.get(runs_key(failing)) or 0) == 2, "failed once, then applied"
    assert {applied(database_url, j) for j in (first, healthy, failing)} == {1}
    assert "a consumer step failed" not in worker.log()
    assert query(database_url, "SELECT count(*) FROM core.dead_letters") == [(0,)]
