"""A debounce publish while the RabbitMQ promoter holds its claim: the latest data still runs.

Real RabbitMQ (a fresh virtual host) and real Redis, ``PLATFORM_RABBITMQ_DELAYS=delay_store``.
The promoter claims a debounced job's entry, publishes it and waits for RabbitMQ's confirm
(minutes under a memory alarm); the test publishes the same key again exactly there, from
the promoter's ``after_confirm`` seam (claimed, published, confirmed, not yet removed).
Whatever job id that publish returns must reach the queue carrying the new data: the old
data is already on its way under the first job's id, and the consumer's idempotency row
absorbs a second message with an id it has run, so new data under the old id would be lost.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import kombu
import pytest
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.keys import rabbitmq_delay_keys
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.publishing.rabbitmq_delay_promoter import RabbitMQDelayPromoter
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until

QUEUE = "promoter-debounce"
WINDOW = timedelta(seconds=1)


@pytest.fixture
def port_settings(rabbitmq_url: str, redis_url: str, database_url: str) -> PlatformSettings:
    return PlatformSettings.build(
        broker_url=rabbitmq_url,
        redis_url=redis_url,
        database_url=database_url,
        profile="test",
        rabbitmq_delays="delay_store",
        delay_poll_interval_seconds=0.1,
    )


@pytest.fixture
def port(port_settings: PlatformSettings) -> Iterator[QueuePort]:
    app = create_app("rabbitmq_promoter_debounce", settings=port_settings, task_default_queue=QUEUE)
    qp = QueuePort(app)
    yield qp
    qp.close()
    app.close()


def payload(n: int) -> dict[str, Any]:
    return {"tenant_id": "t", "kind": "tests.debounced", "data": {"n": n}}


def debounce(port: QueuePort, n: int) -> uuid.UUID:
    return port.publish(
        QUEUE, payload(n), unique_key="sync:t", unique_for=WINDOW, unique_mode="debounce"
    )


def queued_jobs(url: str) -> list[tuple[str, int]]:
    """``(job id, data n)`` of every message on the queue, in order."""
    jobs = []
    with kombu.Connection(url) as conn:
        while (message := conn.default_channel.basic_get(QUEUE, no_ack=True)) is not None:
            envelope = json.loads(message.body)[0][0]
            jobs.append((str(envelope["job_id"]), int(envelope["data"]["n"])))
    return jobs


def test_a_debounce_while_the_promoter_holds_its_claim_runs_the_new_data(
    port: QueuePort, port_settings: PlatformSettings, redis_client: redis.Redis
) -> None:
    store = DelayStore(redis_client, rabbitmq_delay_keys("test"))
    first = debounce(port, 1)
    during_claim: list[uuid.UUID] = []
    errors: list[BaseException] = []
    published = threading.Event()

    def publish_again_while_claimed(entry_ids: list[str]) -> None:
        if published.is_set():
            return
        try:
            assert store.pending() == 1, "the claimed entry is still stored"
            during_claim.append(debounce(port, 2))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        finally:
            published.set()

    promoter = RabbitMQDelayPromoter(
        port.app, name="debounce-promoter", after_confirm=publish_again_while_claimed
    )
    promoter.start()
    try:
        wait_until(published.is_set, timeout=60, message="the promoter confirmed the first job")
        assert not errors, errors
        wait_until(lambda: store.pending() == 0, timeout=60, message="the store emptied")
    finally:
        promoter.stop()
    jobs = queued_jobs(str(port_settings.broker_url))
    (second,) = during_claim
    assert (str(first), 1) in jobs, jobs  # the claimed data was already published
    assert (str(second), 2) in jobs, f"the latest data never reached the queue: {jobs}"
    data_of: dict[str, set[int]] = {}
    for job_id, n in jobs:
        data_of.setdefault(job_id, set()).add(n)
    assert all(len(ns) == 1 for ns in data_of.values()), f"one job id, two data: {jobs}"
