"""A retried job keeps its queue and its queue's retry policy on RabbitMQ.

``celery -A tests.apps.ledger_app worker`` (no ``-Q``) consumes the app's two declared
queues. Jobs go to ``ledger`` (its own topic exchange, routing key ``ledger.entries``, a
policy of 3 attempts one second apart); the task names no queue, so only the delivery's
routing says where a job came from. A failed attempt is scheduled back through RabbitMQ's
native delayed delivery, whose messages arrive from ``celery_delayed_delivery`` with the
countdown's bits before the routing key: the retry must still be judged by ``ledger``'s
policy (not the default 5 attempts 30 s apart) and sent back to ``ledger``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.ledger_app import (
    DEFAULT_QUEUE,
    LEDGER_MAX_ATTEMPTS,
    LEDGER_QUEUE,
    QUEUES,
    exchanges_key,
    runs_key,
)
from tests.e2e.brokers.rabbitmq.conftest import Workers, applied, query, queue_types, vhost_of
from tests.support.servers import RabbitMQServer

APP = "tests.apps.ledger_app"


@pytest.fixture
def ledger_port(broker_settings: PlatformSettings) -> Iterator[QueuePort]:
    """A producer with the application's own queue declarations, as ``celery_app`` gives."""
    app = create_app(
        "ledger_producer",
        settings=broker_settings,
        task_default_queue=DEFAULT_QUEUE,
        task_queues=QUEUES,
    )
    qp = QueuePort(app)
    yield qp
    qp.close()
    app.close()


def dead_letters(database_url: str, job_id: object) -> list[tuple[object, ...]]:
    return query(
        database_url,
        "SELECT queue, reason, attempts FROM core.dead_letters WHERE job_id = %s",
        str(job_id),
    )


def test_a_retried_job_keeps_its_queue_and_policy_through_native_delayed_delivery(
    ledger_port: QueuePort,
    workers: Workers,
    broker_settings: PlatformSettings,
    rabbitmq_server: RabbitMQServer,
    redis_client: redis.Redis,
) -> None:
    database_url = str(broker_settings.database_url)
    workers.start(app=APP)
    entry = {"tenant_id": "t1", "kind": "tests.ledger.apply"}
    recovers = ledger_port.publish(
        LEDGER_QUEUE, {**entry, "data": {"key": "recovers", "fail_times": 2}}
    )
    exhausted = ledger_port.publish(
        LEDGER_QUEUE, {**entry, "data": {"key": "exhausted", "fail_times": 99}}
    )

    def settled() -> bool:
        return applied(database_url, recovers) == 1 and bool(dead_letters(database_url, exhausted))

    try:
        # Three attempts 1 s apart take a few seconds. Judged by the default policy, the
        # third attempt waits 30-60 s and a failing one is retried again, not dead-lettered.
        wait_until(settled, timeout=60, message="one job applied, one dead-lettered")
    except TimeoutError as exc:
        raise AssertionError(
            f"{exc}; runs: {[redis_client.get(runs_key(j)) for j in (recovers, exhausted)]}; "
            f"applied: {applied(database_url, recovers)}; "
            f"dead letters: {dead_letters(database_url, exhausted)}; "
            f"queues: {rabbitmq_server.queue_depths(vhost_of(broker_settings))}"
        ) from exc

    # applied once, on the attempt its policy allowed, after two retries
    assert applied(database_url, recovers) == 1
    assert int(redis_client.get(runs_key(recovers)) or 0) == 3
    assert dead_letters(database_url, recovers) == []
    # dead-lettered by ledger's policy: 3 attempts, and recorded against ledger
    assert dead_letters(database_url, exhausted) == [
        (LEDGER_QUEUE, "retries_exhausted", LEDGER_MAX_ATTEMPTS)
    ]
    assert int(redis_client.get(runs_key(exhausted)) or 0) == LEDGER_MAX_ATTEMPTS
    assert applied(database_url, exhausted) == 0
    # the retries really came back through RabbitMQ's native delayed delivery
    for job_id in (recovers, exhausted):
        came_through = [e.decode() for e in redis_client.lrange(exchanges_key(job_id), 0, -1)]
        assert came_through == [LEDGER_QUEUE] + ["celery_delayed_delivery"] * 2, came_through
    # nothing left waiting anywhere, and no queue was made up from a delayed routing key
    types = queue_types(rabbitmq_server, broker_settings)
    assert types[LEDGER_QUEUE] == "quorum"
    assert [n for n in types if n[:2] in ("0.", "1.")] == [], types
    # queue counts lag by up to a second (the harness' statistics interval); a fourth
    # attempt still on its way would show in a delayed queue, then as a fourth run
    wait_until(
        lambda: not any(rabbitmq_server.queue_depths(vhost_of(broker_settings)).values()),
        timeout=60,
        message="every queue of the vhost empty",
    )
    assert [int(redis_client.get(runs_key(j)) or 0) for j in (recovers, exhausted)] == [3, 3]
