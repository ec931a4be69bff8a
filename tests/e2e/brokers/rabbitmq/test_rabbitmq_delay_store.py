"""Delays on RabbitMQ through the Redis delay store (``PLATFORM_RABBITMQ_DELAYS=delay_store``).

Workers start as the README says (``celery -A tests.apps.consumer_app worker``, no ``-Q``)
with ``PLATFORM_RABBITMQ_DELAYS=delay_store``; each runs the promoter that publishes due
entries to RabbitMQ with publisher confirms. Work rows in PostgreSQL show how often a job
was applied (no unique key, so twice shows as two rows); the handler counts its runs in
Redis, and a duplicate the idempotency row absorbs never reaches the handler.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import kombu
import pytest
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.keys import rabbitmq_delay_keys
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.consumer_app import QUEUE, runs_key
from tests.conftest import REPO_ROOT
from tests.e2e.brokers.rabbitmq.conftest import Workers, applied
from tests.e2e.brokers.rabbitmq.test_rabbitmq_broker import job
from tests.support.database import query
from tests.support.processes import CeleryProcess, celery_processes
from tests.support.rabbitmq_promoter_main import CONFIRMED_KEY
from tests.support.servers import RabbitMQServer

DELAY_STORE = {"PLATFORM_RABBITMQ_DELAYS": "delay_store"}
KEYS = rabbitmq_delay_keys("test")


@pytest.fixture
def store_port(broker_settings: PlatformSettings) -> Iterator[QueuePort]:
    settings = broker_settings.model_copy(update={"rabbitmq_delays": "delay_store"})
    app = create_app("rabbitmq_store_producer", settings=settings, task_default_queue=QUEUE)
    qp = QueuePort(app)
    yield qp
    qp.close()
    app.close()


@pytest.fixture
def store_events(redis_client: redis.Redis) -> Iterator[redis.client.PubSub]:
    """Keyspace notifications of the delay store's schedule: proof an entry passed there.

    The shared Redis gets notifications for sorted sets during the test only.
    """
    redis_client.config_set("notify-keyspace-events", "Kz")
    pubsub = redis_client.pubsub()
    pubsub.subscribe(f"__keyspace@0__:{KEYS.schedule}")
    pubsub.get_message(timeout=5)  # the subscribe confirmation
    yield pubsub
    pubsub.close()
    redis_client.config_set("notify-keyspace-events", "")


def schedule_events(pubsub: redis.client.PubSub) -> list[str]:
    events = []
    while (message := pubsub.get_message(timeout=0.5)) is not None:
        if message["type"] == "message":
            events.append(message["data"].decode())
    return events


def store_is_empty(client: redis.Redis) -> bool:
    return int(client.zcard(KEYS.schedule)) == 0 and int(client.hlen(KEYS.entries)) == 0


def queue_depth(url: str) -> int:
    with kombu.Connection(url) as conn:
        _, ready, _ = conn.default_channel.queue_declare(QUEUE, passive=True)
    return int(ready)


def test_a_delayed_job_and_a_retry_go_through_the_store_and_apply_once(
    store_port: QueuePort,
    workers: Workers,
    broker_settings: PlatformSettings,
    redis_client: redis.Redis,
    store_events: redis.client.PubSub,
) -> None:
    database_url = str(broker_settings.database_url)
    workers.start(**DELAY_STORE)
    run_at = datetime.now(UTC) + timedelta(milliseconds=1500)  # not a whole second
    later_id = store_port.schedule(QUEUE, job("later"), run_at)
    (raw,) = redis_client.hvals(KEYS.entries)
    assert json.loads(raw)["p"]["correlation_id"] == str(later_id), "stored as the AMQP message"
    wait_until(
        lambda: applied(database_url, later_id) == 1, timeout=90, message="delayed job applied"
    )
    assert "zadd" in schedule_events(store_events), "the delayed job waited in the store"

    retried_id = store_port.publish(QUEUE, job("retried", fail_times=1))
    wait_until(
        lambda: applied(database_url, retried_id) == 1, timeout=90, message="retried job applied"
    )
    assert "zadd" in schedule_events(store_events), "the retry waited in the store"

    (applied_at,) = query(
        database_url, "SELECT applied_at FROM public.consumer_work WHERE job_id = %s", str(later_id)
    )[0]
    assert applied_at >= run_at, "the delayed job ran before run_at"
    assert int(redis_client.get(runs_key(later_id)) or 0) == 1
    assert int(redis_client.get(runs_key(retried_id)) or 0) == 2, "one failure, one retry"
    wait_until(
        lambda: store_is_empty(redis_client),
        timeout=30,
        message="published entries removed from the store",
    )
    assert applied(database_url, later_id) == 1 and applied(database_url, retried_id) == 1


def test_a_promoter_killed_between_confirm_and_removal_publishes_again_and_applies_once(
    store_port: QueuePort,
    workers: Workers,
    broker_settings: PlatformSettings,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    """A stand-alone promoter of the app (``tests/support/rabbitmq_promoter_main.py``) stops
    after RabbitMQ confirmed its publish and before it removes the entry; it is SIGKILLed
    there. The lease is 3 s so the worker's own promoter publishes the entry again soon."""
    database_url = str(broker_settings.database_url)
    env = {**workers.env, **DELAY_STORE, "PLATFORM_DELAY_LEASE_SECONDS": "3"}
    with celery_processes() as started:
        promoter = CeleryProcess(
            [sys.executable, "-m", "tests.support.rabbitmq_promoter_main"],
            env=env,
            cwd=REPO_ROOT,
            log_path=tmp_path / "promoter.log",
        ).start()
        started.append(promoter)
        promoter.wait_for_log("promoter started", timeout=120)
        job_id = store_port.schedule(QUEUE, job("once"), datetime.now(UTC) + timedelta(seconds=1))
        (entry_id,) = [e.decode() for e in redis_client.hkeys(KEYS.entries)]
        wait_until(
            lambda: redis_client.llen(CONFIRMED_KEY) == 1,
            timeout=90,
            message="promoter paused after the confirm",
        )
        assert redis_client.lindex(CONFIRMED_KEY, 0) == entry_id.encode()
        assert redis_client.hexists(KEYS.entries, entry_id), "not yet removed"
        assert queue_depth(str(broker_settings.broker_url)) == 1, "confirmed: in the queue"
        promoter.kill_group()  # SIGKILL between confirm and removal
        assert not promoter.running

        worker = workers.start("w1", **DELAY_STORE, PLATFORM_DELAY_LEASE_SECONDS="3")
        wait_until(
            lambda: applied(database_url, job_id) == 1,
            timeout=90,
            message="job applied from the first copy",
        )
        worker.wait_for_log("duplicate delivery skipped", timeout=120)  # the second copy
        wait_until(
            lambda: store_is_empty(redis_client),
            timeout=30,
            message="entry removed after the second confirm",
        )
        wait_until(
            lambda: queue_depth(str(broker_settings.broker_url)) == 0,
            timeout=60,
            message="both copies consumed",
        )
    assert applied(database_url, job_id) == 1
    assert int(redis_client.get(runs_key(job_id)) or 0) == 1, "the handler ran once"


def test_entries_due_while_rabbitmq_is_stopped_are_all_delivered_after_it_restarts(
    store_port: QueuePort,
    workers: Workers,
    broker_settings: PlatformSettings,
    rabbitmq_server: RabbitMQServer,
    redis_client: redis.Redis,
) -> None:
    """The node stops cleanly (SIGTERM; docs/brokers.md says why not SIGKILL) with a worker
    running; jobs are scheduled (Redis only) and fall due while it is down."""
    database_url = str(broker_settings.database_url)
    worker = workers.start("w1", **DELAY_STORE)
    rabbitmq_server.stop()
    run_at = datetime.now(UTC) + timedelta(milliseconds=500)
    ids = [store_port.schedule(QUEUE, job(f"k{i}"), run_at) for i in range(20)]
    assert int(redis_client.zcard(KEYS.schedule)) == 20
    worker.wait_for_log("delay promotion to RabbitMQ failed", timeout=120)
    assert int(redis_client.hlen(KEYS.entries)) == 20, "nothing removed while RabbitMQ is down"
    rabbitmq_server.start()
    try:
        wait_until(
            lambda: all(applied(database_url, j) == 1 for j in ids),
            timeout=180,
            message="every job applied after the restart",
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n--- worker log ---\n{worker.log()[-6000:]}") from exc
    wait_until(lambda: store_is_empty(redis_client), timeout=60, message="store emptied")
    assert [applied(database_url, j) for j in ids] == [1] * 20
