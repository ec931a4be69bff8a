"""A delayed message RabbitMQ returns as unroutable backs off and ends as one dead letter.

Real RabbitMQ (a fresh virtual host), real Redis and PostgreSQL: the promoter publishes a
delayed job whose queue was deleted after the promoter declared it, so the ``mandatory``
publish comes back. Released at once, it would be published again in a tight loop for
ever; it must instead be postponed with growing back-offs and, after ``MAX_RETURNS``
returns, be dead-lettered and leave the store.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import kombu
import pytest
import redis

from platform_tasks import create_app
from platform_tasks.keys import rabbitmq_delay_keys
from platform_tasks.publishing.amqp_wire import AmqpMessage
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.publishing.rabbitmq_delay_promoter import (
    CONFIRM_WAIT_FRACTION,
    MAX_RETURNS,
    UNROUTABLE_DELAYED,
    RabbitMQDelayPromoter,
)
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.support.database import query
from tests.support.servers import RabbitMQServer

QUEUE = "promoter-returns"
BACKOFF = 0.5


def message_for(job_id: str) -> AmqpMessage:
    return AmqpMessage(
        queue=QUEUE,
        exchange="",
        routing_key=QUEUE,
        body='{"n": 1}',
        properties={
            "correlation_id": job_id,
            "content_type": "application/json",
            "application_headers": {"id": job_id, "task": "tests.returned"},
        },
    )


def now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.fixture
def promoter_settings(rabbitmq_url: str, redis_url: str, database_url: str) -> PlatformSettings:
    return PlatformSettings.build(
        broker_url=rabbitmq_url,
        redis_url=redis_url,
        database_url=database_url,
        profile="test",
        rabbitmq_delays="delay_store",
    )


@pytest.fixture
def promoter(promoter_settings: PlatformSettings) -> Iterator[RabbitMQDelayPromoter]:
    app = create_app(
        "rabbitmq_promoter_returns", settings=promoter_settings, task_default_queue=QUEUE
    )
    running = RabbitMQDelayPromoter(app, return_backoff_seconds=BACKOFF)
    yield running
    running.stop()
    app.close()


def test_the_confirm_wait_fits_well_inside_the_claim_lease(
    promoter: RabbitMQDelayPromoter,
) -> None:
    assert promoter.publisher().confirm_timeout == pytest.approx(
        promoter.settings.delay_lease_seconds * CONFIRM_WAIT_FRACTION
    )
    assert promoter.publisher().confirm_timeout < promoter.settings.delay_lease_seconds / 2


def test_an_unroutable_delayed_message_backs_off_and_becomes_one_dead_letter(
    promoter: RabbitMQDelayPromoter,
    rabbitmq_server: RabbitMQServer,
    redis_client: redis.Redis,
    database_url: str,
) -> None:
    store = DelayStore(redis_client, rabbitmq_delay_keys("test"))
    vhost = str(promoter.settings.broker_url).rsplit("/", 1)[1]
    first = str(uuid.uuid4())
    store.add_encoded(first, now_ms(redis_client) - 1, message_for(first).encode())
    promoter.start()
    # the promoter declares the queue on its first publish to it; then the queue goes
    wait_until(
        lambda: rabbitmq_server.queue_depths(vhost).get(QUEUE) == 1,
        timeout=60,
        message="the first delayed job published",
    )
    with kombu.Connection(str(promoter.settings.broker_url)) as conn:
        conn.default_channel.queue_delete(QUEUE)

    returned = str(uuid.uuid4())
    store.add_encoded(returned, now_ms(redis_client) - 1, message_for(returned).encode())
    backoffs: dict[int, int] = {}  # return count -> ms until due again, as postponed
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with redis_client.pipeline(transaction=True) as pipe:  # one consistent read
            pipe.hget(store.keys.returns, returned)
            pipe.zscore(store.keys.schedule, returned)
            pipe.time()
            count, score, (seconds, micros) = pipe.execute()
        seen = int(count) if count is not None else 0
        if 0 < seen < MAX_RETURNS and score is not None and seen not in backoffs:
            backoffs[seen] = int(score) - (int(seconds) * 1000 + int(micros) // 1000)
        if score is None:
            break
        time.sleep(0.01)  # sampling the store's state, not synchronising on it
    assert sorted(backoffs) == list(range(1, MAX_RETURNS)), f"returns seen: {backoffs}"
    # each back-off doubles: measured as "due in" when first seen, so at most the planned
    # back-off and less only by the sampling lag (loose lower bound for a loaded machine)
    for count in range(1, MAX_RETURNS):
        planned = BACKOFF * 1000 * 2 ** (count - 1)
        assert planned * 0.6 <= backoffs[count] <= planned + 5, f"back-offs: {backoffs}"
    assert [backoffs[c] for c in sorted(backoffs)] == sorted(backoffs.values())

    rows = query(
        database_url,
        "SELECT job_id::text, reason, queue, kind FROM core.dead_letters WHERE job_id = %s",
        returned,
    )
    assert rows == [(returned, UNROUTABLE_DELAYED, QUEUE, "tests.returned")]
    assert store.pending() == 0 and not redis_client.hexists(store.keys.entries, returned)
    assert not redis_client.hexists(store.keys.returns, returned)
    # never looping: a later pass of the promoter writes no second dead letter
    moved_before = promoter.moved_total
    with kombu.Connection(str(promoter.settings.broker_url)) as conn:
        conn.default_channel.queue_declare(QUEUE, durable=True)
    marker = str(uuid.uuid4())
    store.add_encoded(marker, now_ms(redis_client) - 1, message_for(marker).encode())
    wait_until(
        lambda: store.pending() == 0 and promoter.moved_total > moved_before,
        timeout=60,
        message="the promoter ran another pass",
    )
    again = query(
        database_url, "SELECT count(*) FROM core.dead_letters WHERE job_id = %s", returned
    )
    assert again[0][0] == 1


def test_a_confirm_slower_than_the_lease_publishes_a_delayed_job_once(
    rabbitmq_server: RabbitMQServer,
    rabbitmq_url: str,
    redis_url: str,
    database_url: str,
    redis_client: redis.Redis,
) -> None:
    """Publishers blocked by a memory alarm (``set_vm_memory_high_watermark 0``): no confirm
    arrives until the alarm is cleared, longer than a 3 s lease. Two promoters share the
    store; the job must reach its queue once."""
    settings = PlatformSettings.build(
        broker_url=rabbitmq_url,
        redis_url=redis_url,
        database_url=database_url,
        profile="test",
        rabbitmq_delays="delay_store",
        delay_lease_seconds=3,
    )
    app = create_app("rabbitmq_promoter_slow_confirm", settings=settings, task_default_queue=QUEUE)
    store = DelayStore(redis_client, rabbitmq_delay_keys("test"))
    first, second = RabbitMQDelayPromoter(app, name="p1"), RabbitMQDelayPromoter(app, name="p2")
    rabbitmq_server.ctl("set_vm_memory_high_watermark", "0")
    try:
        job = str(uuid.uuid4())
        store.add_encoded(job, now_ms(redis_client) - 1, message_for(job).encode())
        first.start()
        second.start()
        scores: set[float] = set()  # due times the entry had: one per claim or release

        def claimed_past_a_lease() -> bool:
            score = redis_client.zscore(store.keys.schedule, job)
            if score is not None:
                scores.add(score)
            return bool(scores) and max(scores) - min(scores) >= 3000  # a lease has passed

        wait_until(
            claimed_past_a_lease,
            timeout=60,
            message="a lease passed while the broker blocks publishers",
        )
    finally:
        rabbitmq_server.ctl("set_vm_memory_high_watermark", "0.4")
    try:
        wait_until(lambda: store.pending() == 0, timeout=120, message="the job published")
        first.stop()
        second.stop()
        copies = 0
        with kombu.Connection(rabbitmq_url) as conn:
            while conn.default_channel.basic_get(QUEUE, no_ack=True) is not None:
                copies += 1
        assert copies == 1, f"the delayed job reached its queue {copies} times"
    finally:
        first.stop()
        second.stop()
        app.close()
