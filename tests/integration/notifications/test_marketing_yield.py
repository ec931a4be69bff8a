"""The marketing-yield step against the real broker: depth read through kombu, hysteresis,
and a worker that consumes only the marketing queue.

The step runs on a consumer stand-in that records what it asks of the consumer
(``cancel_task_queue``/``add_task_queue``, the calls Celery's control commands use); the
end-to-end test runs it inside a real worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.notifications.marketing_yield import MarketingYield, broker_depth
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until

TRANSACTIONAL = "notif.email.transactional"
MARKETING = "notif.email.marketing"


class Timer:
    def __init__(self) -> None:
        self.calls: list[tuple[float, Callable[..., Any]]] = []

    def call_repeatedly(
        self, secs: float, fun: Callable[..., Any], args: Any = (), priority: int = 0
    ) -> Any:
        self.calls.append((secs, fun))
        return self

    def cancel(self) -> None:
        pass


class ConsumerStandIn:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.timer = Timer()
        self.asked: list[tuple[str, str]] = []

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        fn(*args)

    def cancel_task_queue(self, queue: str) -> None:
        self.asked.append(("cancel", queue))

    def add_task_queue(self, queue: str) -> None:
        self.asked.append(("add", queue))


def publish(port: QueuePort, count: int, priority: int | None = None) -> None:
    opts = {"priority": priority} if priority is not None else None
    for n in range(count):
        port.publish(
            TRANSACTIONAL, {"tenant_id": "acme", "kind": "notify.receipt", "data": {"n": n}}, opts
        )


def test_marketing_only_worker_pauses_and_resumes_by_transactional_depth(
    redis_url: str, redis_client: redis.Redis
) -> None:
    settings = PlatformSettings.build(
        redis_url=redis_url, profile="test", marketing_pause_depth=5, marketing_resume_depth=2
    )
    app = create_app("yield_it", settings=settings)
    app.amqp.queues.select([MARKETING])  # as with -Q notif.email.marketing
    port = QueuePort(app)
    consumer = ConsumerStandIn(app)
    step = MarketingYield(consumer)
    step.start(consumer)
    try:
        assert [secs for secs, _ in consumer.timer.calls] == [0.5]
        publish(port, 3)
        publish(port, 3, priority=9)  # another priority list of the same queue
        with app.connection_for_read() as conn:
            assert broker_depth(conn.default_channel, TRANSACTIONAL) == 6
        step.check(consumer)
        assert consumer.asked == [("cancel", MARKETING)]
        step.check(consumer)  # still deep: nothing more
        keys = [k for k in redis_client.keys(f"{TRANSACTIONAL}*")]
        for key in keys:  # drain to 2: not below the resume depth yet
            while redis_client.llen(key) and sum(redis_client.llen(k) for k in keys) > 2:
                redis_client.rpop(key)
        step.check(consumer)
        assert consumer.asked == [("cancel", MARKETING)]
        redis_client.delete(*keys)
        step.check(consumer)
        assert consumer.asked == [("cancel", MARKETING), ("add", MARKETING)]
    finally:
        step.stop(consumer)
        port.close()
        app.close()


def test_worker_without_marketing_does_not_watch(redis_url: str) -> None:
    settings = PlatformSettings.build(redis_url=redis_url, profile="test")
    app = create_app("yield_it2", settings=settings)
    app.amqp.queues.select([TRANSACTIONAL])
    consumer = ConsumerStandIn(app)
    step = MarketingYield(consumer)
    step.start(consumer)
    assert consumer.timer.calls == []
    step.stop(consumer)
    app.close()


def redis_now_ms(client: redis.Redis) -> int:
    """The server's clock in milliseconds, the clock the provider bucket's slots use."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_marketing_pauses_while_transactional_sends_wait_for_provider_tokens(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """The yield gives transactional sends priority: the step stops fetching marketing
    while refused transactional sends hold slots more than 1 s ahead (``next_t`` of the
    provider bucket) and fetches again below 0.25 s. Marketing's own refused sends
    (``next_m``, however far ahead) never pause it: with transactional quiet, marketing
    is what fills the provider, and a pause would leave that capacity unused."""
    from platform_tasks.keys import rate_limit_keys
    from platform_tasks.notifications import NotificationTask

    settings = PlatformSettings.build(redis_url=redis_url, profile="test")
    app = create_app("yield_it3", settings=settings)

    @app.task(base=NotificationTask, name="shop.blast", rail="marketing", lazy=False, shared=False)
    def blast(envelope: Any, tx: Any) -> None: ...

    app.amqp.queues.select([MARKETING])
    consumer = ConsumerStandIn(app)
    step = MarketingYield(consumer)
    step.start(consumer)
    bucket = rate_limit_keys("test", "resend").bucket
    try:
        # each slot is set from Redis TIME read just before it, so the time a loaded
        # machine spends between two steps does not move a slot across a mark
        redis_client.hset(bucket, "next_m", str(redis_now_ms(redis_client) + 30_000))
        step.check(consumer)  # marketing's own queue at the provider: keep fetching
        assert consumer.asked == []
        redis_client.hset(bucket, "next_t", str(redis_now_ms(redis_client) + 5_000))
        step.check(consumer)
        assert consumer.asked == [("cancel", MARKETING)]
        redis_client.hset(bucket, "next_t", str(redis_now_ms(redis_client) + 700))
        step.check(consumer)  # between the resume and the pause mark: stays paused
        assert consumer.asked == [("cancel", MARKETING)]
        redis_client.hset(bucket, "next_t", str(redis_now_ms(redis_client)))
        step.check(consumer)
        assert consumer.asked == [("cancel", MARKETING), ("add", MARKETING)]
    finally:
        step.stop(consumer)
        app.close()


def test_on_rabbitmq_depth_is_read_from_the_quorum_queue_even_before_it_exists(
    rabbitmq_url: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A marketing-only worker may start before anything declared the transactional queue:
    the passive ``queue.declare`` is refused (404, which closes the AMQP channel), the depth
    counts as 0, and the next reads still work once the queue exists."""
    settings = PlatformSettings.build(
        redis_url=redis_url,
        broker_url=rabbitmq_url,
        profile="test",
        marketing_pause_depth=5,
        marketing_resume_depth=2,
    )
    app = create_app("yield_it_amqp", settings=settings)
    app.amqp.queues.select([MARKETING])  # as with -Q notif.email.marketing
    consumer = ConsumerStandIn(app)
    step = MarketingYield(consumer)
    step.start(consumer)
    port = QueuePort(app)
    try:
        with caplog.at_level(logging.WARNING, logger="platform_tasks.notifications"):
            for _ in range(3):
                step.check(consumer)
            assert consumer.asked == []
            publish(port, 8)  # declares the quorum queue and fills it
            step.check(consumer)
            assert consumer.asked == [("cancel", MARKETING)]
            with app.connection_for_write() as conn:
                assert broker_depth(conn.default_channel, TRANSACTIONAL) == 8
                conn.default_channel.queue_purge(TRANSACTIONAL)
            step.check(consumer)
            assert consumer.asked == [("cancel", MARKETING), ("add", MARKETING)]
        unreadable = [
            r
            for r in caplog.records
            if getattr(r, "event", None) == "notifications.depth_unreadable"
        ]
        assert unreadable == []
    finally:
        step.stop(consumer)
        port.close()
        app.close()


def test_a_check_while_the_broker_is_down_returns_at_once_and_keeps_marketing_as_it_was(
    server_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The check runs on the worker's event loop every half second. With the broker gone,
    one look must fail fast (one connection attempt), not wait out kombu's reconnect
    schedule on every tick while acks and results queue up behind it."""
    server = server_factory.redis()
    settings = PlatformSettings.build(redis_url=server.url, profile="test")
    app = create_app("yield_it_down", settings=settings)
    app.amqp.queues.select([MARKETING])
    consumer = ConsumerStandIn(app)
    step = MarketingYield(consumer)
    step.start(consumer)
    try:
        step.check(consumer)  # connected while Redis is up
        server.stop()
        took = []
        with caplog.at_level(logging.WARNING, logger="platform_tasks.notifications"):
            for _ in range(3):
                started = time.monotonic()
                step.check(consumer)
                took.append(time.monotonic() - started)
        assert max(took) < 1.0, f"checks with the broker down took {took}"
        assert consumer.asked == []
        unreadable = [r for r in caplog.records if "depth unreadable" in r.getMessage()]
        assert len(unreadable) == 1, "logged once per outage, not per tick"
        server.start()
        publish_port = QueuePort(app)
        try:
            publish(publish_port, 1)
        finally:
            publish_port.close()
        step.check(consumer)  # reads again once the broker is back
        assert consumer.asked == []
        assert step.reader is not None
        assert step.reader.broker_failing is False
    finally:
        step.stop(consumer)
        app.close()


def test_while_redis_does_not_answer_the_yield_keeps_the_last_wait_it_read(
    redis_url: str, server_factory: Any
) -> None:
    """The transactional wait lives in the platform's Redis. Frozen (SIGSTOP: connections
    accepted, never answered), a look at it fails after one attempt of 1 s, off the event
    loop; the yield keeps the last wait it read, so a marketing consumer paused for a
    long transactional wait stays paused, and resumes once Redis answers a short wait.
    The broker is the session's Redis, so depths are read all along."""
    from platform_tasks.keys import rate_limit_keys
    from platform_tasks.notifications import NotificationTask

    server = server_factory.redis()
    client = redis.Redis.from_url(server.url)
    settings = PlatformSettings.build(broker_url=redis_url, redis_url=server.url, profile="test")
    app = create_app("yield_it_frozen", settings=settings)

    @app.task(base=NotificationTask, name="shop.blast", rail="marketing", lazy=False, shared=False)
    def blast(envelope: Any, tx: Any) -> None: ...

    app.amqp.queues.select([MARKETING])
    consumer = ConsumerStandIn(app)
    step = MarketingYield(consumer)
    step.start(consumer)
    bucket = rate_limit_keys("test", "resend").bucket
    try:
        seconds, micros = client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        client.hset(bucket, "next_t", str(now_ms + 60_000))
        step.check(consumer)
        assert consumer.asked == [("cancel", MARKETING)]
        server.freeze()
        try:
            for _ in range(3):
                step.check(consumer)  # depth 0, wait unknown: the last wait (60 s) holds
            assert consumer.asked == [("cancel", MARKETING)]
            assert step.reader is not None and step.reader.redis_failing
        finally:
            server.thaw()
        client.hset(bucket, "next_t", str(now_ms))

        def resumed() -> bool:
            step.check(consumer)
            return consumer.asked == [("cancel", MARKETING), ("add", MARKETING)]

        wait_until(resumed, timeout=30, message="marketing resumed once Redis answers")
    finally:
        step.stop(consumer)
        client.close()
        app.close()
