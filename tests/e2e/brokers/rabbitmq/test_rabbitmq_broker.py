"""The platform on a real RabbitMQ broker, driven through real ``celery -A app worker``.

Workers start the way the README says (no ``-Q``), with ``PLATFORM_BROKER_URL`` pointing at
a fresh virtual host of the session's RabbitMQ node; Redis stays the platform's own Redis
(the test app counts handler runs there) and PostgreSQL holds the work rows, one row per
application, so a job applied twice shows as two rows.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import kombu
import pytest
import redis

from platform_tasks import QueuePort
from platform_tasks.envelope import uuid7
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import QUEUE, runs_key
from tests.e2e.brokers.rabbitmq.conftest import Workers, applied, query, queue_types, vhost_of
from tests.support.servers import RabbitMQServer


def job(key: str, **data: Any) -> dict[str, Any]:
    return {"tenant_id": "t1", "kind": "tests.consumer.apply", "data": {"key": key, **data}}


def test_publish_schedule_and_retry_on_quorum_queues(
    port: QueuePort,
    workers: Workers,
    broker_settings: PlatformSettings,
    rabbitmq_server: RabbitMQServer,
    redis_client: redis.Redis,
) -> None:
    database_url = str(broker_settings.database_url)
    workers.start()
    now_id = port.publish(QUEUE, job("now"))
    run_at = datetime.now(UTC) + timedelta(seconds=2)
    later_id = port.schedule(QUEUE, job("later"), run_at)
    retried_id = port.publish(QUEUE, job("retried", fail_times=1))
    for job_id in (now_id, later_id, retried_id):
        wait_until(
            lambda j=job_id: applied(database_url, j) == 1,
            timeout=90,  # type: ignore[misc]
            message=f"job {job_id} applied",
        )
    # Judged by the row the handler wrote (database clock, this machine), not by when we looked.
    (applied_at,) = query(
        database_url, "SELECT applied_at FROM public.consumer_work WHERE job_id = %s", str(later_id)
    )[0]
    assert applied_at >= run_at, "the delayed job ran before run_at"
    assert int(redis_client.get(runs_key(retried_id)) or 0) == 2, "one failure, one retry"
    assert int(redis_client.get(runs_key(now_id)) or 0) == 1
    types = queue_types(rabbitmq_server, broker_settings)
    assert types[QUEUE] == "quorum", types
    assert types["celery_delayed_0"] == "quorum", "delays wait in quorum queues"
    assert {applied(database_url, j) for j in (now_id, later_id, retried_id)} == {1}


def test_a_delayed_job_survives_a_rabbitmq_restart(
    port: QueuePort,
    workers: Workers,
    broker_settings: PlatformSettings,
    rabbitmq_server: RabbitMQServer,
    redis_client: redis.Redis,
) -> None:
    """No worker runs while the job waits; the node stops (SIGTERM) and starts again."""
    database_url = str(broker_settings.database_url)
    run_at = datetime.now(UTC) + timedelta(seconds=3)
    job_id = port.schedule(QUEUE, job("survivor"), run_at)
    port.close()  # the publisher's connection dies with the node
    rabbitmq_server.restart()
    workers.start()
    wait_until(
        lambda: applied(database_url, job_id) == 1,
        timeout=120,
        message="delayed job applied after the broker restart",
    )
    assert int(redis_client.get(runs_key(job_id)) or 0) == 1


def test_a_sigkilled_worker_s_job_is_redelivered_and_applied_once(
    port: QueuePort,
    workers: Workers,
    broker_settings: PlatformSettings,
    redis_client: redis.Redis,
) -> None:
    database_url = str(broker_settings.database_url)
    first = workers.start("w1")
    job_id = port.publish(QUEUE, job("blocked", block=True))
    wait_until(
        lambda: redis_client.llen("test:started") >= 1, timeout=90, message="handler started"
    )
    first.kill_group()  # worker and pool child die mid-handler; its connection closes
    redis_client.set(f"test:release:{job_id}", 1)
    workers.start("w2")
    wait_until(
        lambda: applied(database_url, job_id) == 1, timeout=120, message="redelivered job applied"
    )
    assert int(redis_client.get(runs_key(job_id)) or 0) == 2, "ran in w1 (killed), then in w2"
    assert applied(database_url, job_id) == 1
    with kombu.Connection(str(broker_settings.broker_url)) as conn:
        _, ready, _ = conn.default_channel.queue_declare(QUEUE, passive=True)
    assert ready == 0


def test_a_job_longer_than_consumer_timeout_neither_loops_nor_is_lost(
    port: QueuePort,
    workers: Workers,
    broker_settings: PlatformSettings,
    rabbitmq_server: RabbitMQServer,
    redis_client: redis.Redis,
) -> None:
    """The node's consumer_timeout is lowered to 8 s for this test (channels opened after).

    The worker is told the same value, so its tasks get a hard time limit of 4 s: the
    blocked job is stopped by Celery before RabbitMQ would close the channel, requeued,
    its redelivery settles the stopped attempt (a retry), and the second stop is
    dead-lettered as the last of 2 attempts, naming the time limit.
    """
    database_url = str(broker_settings.database_url)
    rabbitmq_server.set_consumer_timeout(8000)
    try:
        worker = workers.start(
            "w1", PLATFORM_RABBITMQ_CONSUMER_TIMEOUT_SECONDS="8", CONSUMER_TEST_MAX_ATTEMPTS="2"
        )
        job_id = port.publish(QUEUE, job("endless", block=True))
        wait_until(
            lambda: bool(
                query(
                    database_url, "SELECT 1 FROM core.dead_letters WHERE job_id = %s", str(job_id)
                )
            ),
            timeout=120,
            message="timed-out job dead-lettered",
        )
        ((reason, error_type),) = query(
            database_url,
            "SELECT reason, error_type FROM core.dead_letters WHERE job_id = %s",
            str(job_id),
        )
        assert reason == "retries_exhausted"
        assert error_type == "platform_tasks.errors.HardTimeLimitExceeded"
        assert int(redis_client.get(runs_key(job_id)) or 0) == 2
        assert applied(database_url, job_id) == 0
        assert "TimeLimitExceeded" in worker.log()
        assert "PRECONDITION_FAILED" not in worker.log(), "RabbitMQ cut the delivery first"
    finally:
        rabbitmq_server.set_consumer_timeout(1_800_000)


def test_the_default_prefetch_takes_a_message_only_for_an_idle_process(
    port: QueuePort,
    workers: Workers,
    broker_settings: PlatformSettings,
    redis_client: redis.Redis,
) -> None:
    """Why a task's own time limit is what is held against consumer_timeout.

    RabbitMQ's clock runs from delivery. With the platform's prefetch multiplier of one, a
    one-process worker holds one message while its job runs and the others stay ready on
    the queue (three published, none acked yet, two ready: the worker holds one), so no
    delivery waits behind a running job (a larger multiplier is checked at start-up:
    ``tests/unit/brokers/test_broker_selection.py``).
    """
    database_url = str(broker_settings.database_url)
    workers.start("w1")  # one process, the README's command

    def ready() -> int:
        with kombu.Connection(str(broker_settings.broker_url)) as conn:
            _, count, _ = conn.default_channel.queue_declare(QUEUE, passive=True)
        return int(count)

    job_ids = [port.publish(QUEUE, job(f"held-{n}", block=True)) for n in range(3)]
    for n in range(3):
        wait_until(
            lambda n=n: redis_client.llen("test:started") == n + 1,
            timeout=60,  # type: ignore[misc]
            message=f"job {n + 1} of 3 started",
        )
        started = redis_client.lindex("test:started", n)
        assert started is not None
        try:
            wait_until(
                lambda n=n: ready() == 2 - n,
                timeout=30,  # type: ignore[misc]
                message=f"{2 - n} ready while job {n + 1} runs",
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; last seen {ready()} ready") from None
        redis_client.set(f"test:release:{started.decode().split(':')[0]}", 1)
    for job_id in job_ids:
        wait_until(
            lambda j=job_id: applied(database_url, j) == 1,
            timeout=60,  # type: ignore[misc]
            message=f"job {job_id} applied",
        )
    assert {applied(database_url, j) for j in job_ids} == {1}


def test_schedule_many_delivers_each_job_once_at_or_after_its_time(
    port: QueuePort,
    workers: Workers,
    broker_settings: PlatformSettings,
    rabbitmq_server: RabbitMQServer,
    redis_client: redis.Redis,
) -> None:
    """Bulk scheduling on RabbitMQ: one native delayed publish per job, whole seconds."""
    database_url = str(broker_settings.database_url)
    workers.start(concurrency=2)
    refused_id = str(uuid7())
    now = datetime.now(UTC)
    with pytest.raises(ValueError, match="timezone-aware"):
        # validated before anything is sent: the good first item must not arrive either
        good = ({**job("refused"), "job_id": refused_id}, now + timedelta(seconds=1))
        port.schedule_many(QUEUE, [good, (job("naive"), datetime.now() + timedelta(seconds=1))])
    now = datetime.now(UTC)
    items = [
        (job(f"bulk-{n}"), now + timedelta(seconds=1 + n % 3, milliseconds=47 * n))
        for n in range(20)
    ]
    items.append((job("already-due"), now - timedelta(seconds=5)))
    job_ids = port.schedule_many(QUEUE, items)
    assert len(set(job_ids)) == len(items)
    for job_id in job_ids:
        wait_until(
            lambda j=job_id: applied(database_url, j) >= 1,
            timeout=90,  # type: ignore[misc]
            message=f"bulk job {job_id} applied",
        )
    rows = query(database_url, "SELECT job_id, applied_at FROM public.consumer_work")
    applied_at = {str(job_id): at for job_id, at in rows}
    assert len(rows) == len(items), "each job applied exactly once"
    for job_id, (_, run_at) in zip(job_ids, items, strict=True):
        # judged by the row the handler wrote (database clock, this machine)
        assert applied_at[str(job_id)] >= run_at, f"{job_id} ran before its run_at"
        assert int(redis_client.get(runs_key(job_id)) or 0) == 1
    assert applied(database_url, refused_id) == 0
    # Nothing else waits: RabbitMQ's queue counts lag by up to a second (the harness'
    # statistics interval), and a late copy from a delayed queue would show as a second row.
    wait_until(
        lambda: not any(rabbitmq_server.queue_depths(vhost_of(broker_settings)).values()),
        timeout=60,
        message="every queue of the vhost empty",
    )
    assert len(query(database_url, "SELECT 1 FROM public.consumer_work")) == len(items)
