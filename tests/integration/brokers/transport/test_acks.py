"""Acks, rejects and restores of the platform transport against the real Redis.

These follow kombu's own Redis transport tests where they apply, plus the property the
platform transport exists for: a consumer killed right after Redis handed it a message
does not lose that message.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import redis
from kombu import Consumer, Exchange, Producer, Queue

from platform_tasks.brokers.transport import TRANSPORT_PATH
from tests.integration.brokers.transport.conftest import ConnectionFactory
from tests.integration.brokers.transport.helpers import collector, drain_until, queued

REPO_ROOT = Path(__file__).resolve().parents[4]


def _queue(name: str = "jobs") -> Queue:
    return Queue(name, Exchange(name), name)


def _publish(conn, queue: Queue, *bodies: object, **kwargs: object) -> None:  # type: ignore[no-untyped-def]
    producer = Producer(conn.channel())
    for body in bodies:
        producer.publish(
            body, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue], **kwargs
        )


def test_message_is_unacked_until_acked(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect()
    queue = _queue()
    _publish(conn, queue, {"n": 1})
    received, on_message = collector()
    with Consumer(conn, [queue], callbacks=[on_message]):
        drain_until(conn, lambda: len(received) == 1)
        tag = received[0].delivery_tag
        assert redis_client.llen("jobs") == 0
        assert redis_client.hexists("unacked", tag)
        assert redis_client.zscore("unacked_index", tag) is not None
        received[0].ack()
    assert redis_client.hlen("unacked") == 0
    assert redis_client.zcard("unacked_index") == 0


def test_unacked_record_keeps_the_message_verbatim(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect()
    queue = _queue()
    _publish(conn, queue, {"text": "héllo", "nested": {"list": [], "none": None}})
    received, on_message = collector()
    with Consumer(conn, [queue], callbacks=[on_message]):
        drain_until(conn, lambda: len(received) == 1)
        record = json.loads(redis_client.hget("unacked", received[0].delivery_tag))
        message, exchange, routing_key = record
        assert (exchange, routing_key) == ("jobs", "jobs")
        assert message["properties"]["delivery_tag"] == received[0].delivery_tag
        assert received[0].payload == {"text": "héllo", "nested": {"list": [], "none": None}}
        received[0].ack()


def test_reject_with_requeue_puts_the_message_back(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect()
    queue = _queue()
    _publish(conn, queue, {"n": 1})
    received, on_message = collector()
    with Consumer(conn, [queue], callbacks=[on_message]):
        drain_until(conn, lambda: len(received) == 1)
        received[0].reject(requeue=True)
        assert redis_client.hlen("unacked") == 0
        drain_until(conn, lambda: len(received) == 2)
        assert received[1].payload == {"n": 1}
        assert received[1].delivery_info["redelivered"] is True
        received[1].ack()
    assert redis_client.hlen("unacked") == 0


def test_reject_without_requeue_drops_the_message(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect()
    queue = _queue()
    _publish(conn, queue, {"n": 1})
    received, on_message = collector()
    with Consumer(conn, [queue], callbacks=[on_message]):
        drain_until(conn, lambda: len(received) == 1)
        received[0].reject(requeue=False)
    assert redis_client.hlen("unacked") == 0
    assert redis_client.zcard("unacked_index") == 0
    assert redis_client.llen("jobs") == 0


def test_unacked_messages_are_restored_at_shutdown(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect()
    queue = _queue()
    _publish(conn, queue, {"n": 1}, {"n": 2})
    received, on_message = collector()
    consumer = Consumer(conn, [queue], callbacks=[on_message])
    consumer.consume()
    drain_until(conn, lambda: len(received) == 2)
    assert redis_client.llen("jobs") == 0
    conn.release()
    assert queued(redis_client, "jobs") == 2
    assert redis_client.hlen("unacked") == 0


def test_expired_unacked_message_is_restored_by_another_consumer(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    first = connect(visibility_timeout=1)
    queue = _queue()
    _publish(first, queue, {"n": 1})
    received, on_message = collector()
    consumer = Consumer(first, [queue], callbacks=[on_message])
    consumer.consume()
    drain_until(first, lambda: len(received) == 1)
    first.default_channel.do_restore = False  # behave like a dead worker: no restore
    first.release()
    assert redis_client.llen("jobs") == 0
    assert redis_client.hlen("unacked") == 1

    second = connect(visibility_timeout=1)
    again, on_again = collector()
    with Consumer(second, [queue], callbacks=[on_again]):
        drain_until(second, lambda: len(again) == 1, timeout=15)
        assert again[0].payload == {"n": 1}
        assert again[0].delivery_info["redelivered"] is True
        again[0].ack()
    assert redis_client.hlen("unacked") == 0


def test_restore_interval_is_never_longer_than_the_visibility_timeout(
    connect: ConnectionFactory,
) -> None:
    assert connect(visibility_timeout=2).default_channel.restore_interval <= 2
    assert connect(visibility_timeout=300).default_channel.restore_interval <= 10
    explicit = connect(visibility_timeout=5, unacked_restore_interval=60)
    assert explicit.default_channel.restore_interval == 5


def _kill_after_fetch(redis_url: str, transport: str, queue: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration.brokers.transport.kill_after_fetch",
            redis_url,
            transport,
            queue,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == -9, result.stderr.decode()[-2000:]


def test_consumer_killed_after_the_fetch_loses_nothing(
    connect: ConnectionFactory, redis_url: str, redis_client: redis.Redis
) -> None:
    queue = _queue()
    _publish(connect(), queue, {"n": 1})
    _kill_after_fetch(redis_url, TRANSPORT_PATH, "jobs")
    assert redis_client.llen("jobs") == 0
    assert redis_client.hlen("unacked") == 1

    survivor = connect(visibility_timeout=1)
    received, on_message = collector()
    with Consumer(survivor, [queue], callbacks=[on_message]):
        drain_until(survivor, lambda: len(received) == 1, timeout=15)
        assert received[0].payload == {"n": 1}
        received[0].ack()


def test_stock_transport_loses_the_message_in_the_same_window(
    connect: ConnectionFactory, redis_url: str, redis_client: redis.Redis
) -> None:
    """Reference: the scenario above does reach the window stock kombu cannot cover."""
    queue = _queue()
    _publish(connect(stock=True), queue, {"n": 1})
    _kill_after_fetch(redis_url, "stock", "jobs")
    assert redis_client.llen("jobs") == 0
    assert redis_client.hlen("unacked") == 0


def test_basic_get_records_and_acks(connect: ConnectionFactory, redis_client: redis.Redis) -> None:
    conn = connect()
    queue = _queue()
    _publish(conn, queue, {"n": 1}, {"n": 2})
    channel = conn.channel()
    message = channel.basic_get("jobs")
    assert message.payload == {"n": 1}
    assert redis_client.hexists("unacked", message.delivery_tag)
    message.ack()
    assert redis_client.hlen("unacked") == 0
    unacked_free = channel.basic_get("jobs", no_ack=True)
    assert unacked_free.payload == {"n": 2}
    assert redis_client.hlen("unacked") == 0
    assert channel.basic_get("jobs") is None


def test_late_ack_of_a_restored_copy_keeps_the_redelivered_copys_record(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    """Each delivery has its own record: a slow consumer whose message expired and went
    to another consumer acks its copy without deleting the other copy's record."""
    queue = _queue()
    slow = connect(visibility_timeout=1)
    _publish(slow, queue, {"n": 1})
    first, on_first = collector()
    with Consumer(slow, [queue], callbacks=[on_first]):
        drain_until(slow, lambda: len(first) == 1)
        other = connect(visibility_timeout=1)
        second, on_second = collector()
        with Consumer(other, [queue], callbacks=[on_second]):
            # The other consumer's sweep finds the expired record and takes the message.
            drain_until(other, lambda: len(second) == 1, timeout=15)
            assert second[0].payload == {"n": 1}
            assert second[0].delivery_tag != first[0].delivery_tag
            first[0].ack()
            assert redis_client.hexists("unacked", second[0].delivery_tag)
            assert redis_client.zscore("unacked_index", second[0].delivery_tag) is not None
            second[0].ack()
    assert redis_client.hlen("unacked") == 0


def test_a_consumer_added_later_gets_its_own_fetch_plan(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    """The fetch command is packed once per plan: the same queue consumed again without
    acks, and a queue consumed later (as ``celery control add_consumer`` does), must each
    get a new one: the no-ack queue's messages leave no unacked record, the added queue's
    messages arrive and are recorded."""
    conn = connect()
    jobs, extra = _queue("jobs"), _queue("extra")
    _publish(conn, jobs, {"n": 1}, {"n": 2})
    received, on_message = collector()
    with Consumer(conn, [jobs], callbacks=[on_message]):
        drain_until(conn, lambda: len(received) == 2)
        assert redis_client.hlen("unacked") == 2
        for message in received:
            message.ack()
    with Consumer(conn, [jobs], callbacks=[on_message], no_ack=True):
        _publish(conn, jobs, {"n": 3})
        drain_until(conn, lambda: len(received) == 3)
        assert received[2].payload == {"n": 3}
        assert redis_client.hlen("unacked") == 0, "a no-ack queue's message was recorded"
        with Consumer(conn, [extra], callbacks=[on_message]):
            _publish(conn, extra, {"n": 4})
            drain_until(conn, lambda: len(received) == 4)
            assert received[3].payload == {"n": 4}
            assert redis_client.hexists("unacked", received[3].delivery_tag), "not recorded"
            received[3].ack()
