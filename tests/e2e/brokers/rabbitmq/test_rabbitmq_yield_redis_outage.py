"""While the platform's Redis is away, the marketing yield never holds the worker's loop.

The yield reads how long refused transactional sends wait for provider tokens from the
platform's Redis on every tick. That read ran on the consumer's event loop: with Redis
stopped, each tick spent seconds in redis-py's connection retries and the loop that
dispatches deliveries, acks them and sends heartbeats for every queue stood still.

Here the platform's Redis is a server of the test's own (the harness's server factory),
RabbitMQ the broker, and the worker ``celery -A tests.apps.yield_outage_app worker`` (no
``-Q``): it consumes the marketing rail, so the yield runs and watches the provider bucket
of its marketing task. The test stops Redis with SIGSTOP (``RedisServer.freeze``): its port
still accepts connections and never answers, as a hung Redis or one behind a silent
network cut does. (A Redis stopped with SIGTERM refuses connections at once; then each
look failed in microseconds and jobs were applied in 3-7 ms even before the fix.) For
ten seconds, twenty ticks of the yield, plain jobs on the default queue (no token and, on
a first delivery, no Redis needed) are published one after another; each must be
applied, publish to row in PostgreSQL, within 2 s.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from platform_tasks import QueuePort, create_app
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import WORK_TABLE_SQL
from tests.apps.yield_outage_app import QUEUE
from tests.conftest import REPO_ROOT, ServerFactory
from tests.e2e.brokers.rabbitmq.conftest import applied
from tests.support.database import query
from tests.support.processes import celery_processes, platform_env, start_worker
from tests.support.resend_server import API_KEY

OUTAGE_SECONDS = 10.0
"""How long jobs are published into the outage: twenty of the yield's 0.5 s ticks."""
PACE_SECONDS = 0.3
"""Between two jobs: the load's rate, not a synchronisation (each job is waited for)."""
APPLIED_WITHIN_SECONDS = 2.0


def test_jobs_are_applied_within_two_seconds_while_the_platform_redis_is_frozen(
    rabbitmq_url: str, database_url: str, server_factory: ServerFactory, tmp_path: Path
) -> None:
    query(database_url, WORK_TABLE_SQL)
    query(database_url, "TRUNCATE public.consumer_work")
    platform_redis = server_factory.redis()
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
            "PLATFORM_PROVIDER_RATE_LIMITS": "resend=10/s",
            "PLATFORM_RESEND_API_KEY": API_KEY,
            # nothing listens here: no email is sent in this test
            "PLATFORM_RESEND_BASE_URL": "http://127.0.0.1:9",
        },
    )
    producer = create_app("yield_outage_producer", settings=settings, task_default_queue=QUEUE)
    port = QueuePort(producer)

    def publish_and_time(key: str) -> float:
        job_id = port.publish(
            QUEUE, {"tenant_id": "t1", "kind": "tests.yield_outage.apply", "data": {"key": key}}
        )
        started = time.monotonic()
        wait_until(
            lambda: applied(database_url, job_id) == 1,
            timeout=60,
            interval=0.02,
            message=f"job {key} applied",
        )
        return time.monotonic() - started

    with celery_processes() as started:
        worker = start_worker(
            started,
            "tests.apps.yield_outage_app",
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "worker.log",
            ready_timeout=120,
        )
        try:
            publish_and_time("before the outage")
            platform_redis.freeze()
            latencies: list[float] = []
            outage_ends = time.monotonic() + OUTAGE_SECONDS
            while time.monotonic() < outage_ends:
                latencies.append(publish_and_time(f"outage {len(latencies)}"))
                threading.Event().wait(PACE_SECONDS)
        except (TimeoutError, AssertionError) as exc:
            raise AssertionError(f"{exc}\n--- worker log ---\n{worker.log()[-6000:]}") from exc
        finally:
            port.close()
            producer.close()
    print("publish-to-row seconds during the outage:", [round(s, 3) for s in latencies])
    slow = [round(s, 3) for s in latencies if s >= APPLIED_WITHIN_SECONDS]
    assert slow == [], f"applied after {slow} s (all: {[round(s, 3) for s in latencies]})"
    assert "a consumer step failed" not in worker.log()
    # the yield did look at the frozen Redis meanwhile (and said so once)
    assert worker.log().count("transactional wait unreadable") == 1
