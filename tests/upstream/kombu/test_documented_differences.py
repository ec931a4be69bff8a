"""What the platform transport does where kombu's own suite expects stock behaviour.

Each test here pairs with an upstream test listed in ``conftest.DOCUMENTED_DIFFERENCES``
(deselected there: its outcome on this transport depends on timing) and asserts the
platform's behaviour in the same scenario, with the upstream suite's own fixture and
helpers. See ``docs/transport.md``,
"Differences from kombu's transport".
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
from unittest.mock import patch
from uuid import uuid4

import pytest
import redis
from kombu import Connection, Consumer, Producer, Queue
from kombu.asynchronous.hub import Hub
from kombu.message import Message

from platform_tasks.brokers.transport import TRANSPORT_PATH
from platform_tasks.testing.servers import wait_until
from tests.upstream.kombu import test_redis as upstream_redis  # its classes: not collected here
from tests.upstream.kombu.test_redis import (  # the upstream fixture and helper
    _FreezableProxy,
    connection,
)
from tests.upstream.kombu.test_redis_brpop_qos import (  # the upstream fixture and helpers
    assert_paused,
    consuming,
    run_until,
    tick,
)

__all__ = ["connection", "consuming"]  # fixtures, used by name

Consuming = tuple  # (connection, queue, consumer, received), as the upstream fixture yields


def _pause_with_empty_reply(consuming: Consuming, hub: Hub | None) -> tuple[object, socket.socket]:
    """The upstream ``pending_reply``, except that message 2 is published only once the
    pending command has answered (so the test does not depend on which came first)."""
    connection, queue, consumer, _ = consuming
    channel = consumer.channel
    if hub is not None:
        connection.register_with_event_loop(hub)
        tick(hub)
    else:
        connection.transport.cycle.on_poll_start()
    pending = channel._in_poll
    assert pending is not None
    sock = pending._sock
    consumer.qos(prefetch_count=1)
    assert select.select([sock], [], [], 5)[0]  # the fetch found the queue empty
    Producer(connection).publish(2, routing_key=queue.name, serializer="json")
    return pending, sock


def _broker() -> redis.Redis:
    """A client of its own: the channel's client is busy with the pending command."""
    return redis.Redis(host=os.environ["REDIS_HOST"], port=int(os.environ["REDIS_6379_TCP"]))


def _assert_next_message_waits_on_the_list(consuming: Consuming) -> None:
    _, queue, consumer, received = consuming
    client = _broker()
    assert [item.payload for item in received] == [1]
    assert client.llen(queue.name) == 1  # message 2: on its queue, not popped
    assert client.hkeys(consumer.channel.unacked_key) == [received[0].delivery_tag.encode()]


def test_paused_hub_consumer_leaves_the_next_message_on_its_queue(consuming: Consuming) -> None:
    """Pairs with ``test_hub_pauses_pending_brpop_until_ack[message]``.

    Stock kombu's BRPOP reply, read after the ack, carries message 2. The platform's
    pending command is a fetch (or a wait, which never pops): message 2 stays on the list
    while the consumer is paused, where any other consumer can take it and a crash
    cannot lose it, and after the ack a new fetch takes it.
    """
    connection, queue, consumer, received = consuming
    channel = consumer.channel
    hub = Hub()
    try:
        pending, sock = _pause_with_empty_reply(consuming, hub)
        with patch.object(channel, "_brpop_start", wraps=channel._brpop_start) as start:
            tick(hub)
            assert_paused(connection, consumer, sock, hub)
            assert channel._in_poll is pending
            _assert_next_message_waits_on_the_list(consuming)
            received[0].ack()
            run_until(hub, lambda: len(received) == 2)
            assert start.called  # the message was fetched after the pause, not before
        assert received[1].payload == 2
        received[1].ack()
        assert _broker().hlen(channel.unacked_key) == 0
        assert _broker().llen(queue.name) == 0
    finally:
        hub.close()


def test_paused_drain_consumer_leaves_the_next_message_on_its_queue(
    consuming: Consuming,
) -> None:
    """Pairs with ``test_drain_events_resumes_pending_brpop_without_resending``: the same
    without an event loop (``drain_events``)."""
    connection, queue, consumer, received = consuming
    channel = consumer.channel
    pending, sock = _pause_with_empty_reply(consuming, None)
    with patch.object(channel, "_brpop_start", wraps=channel._brpop_start) as start:
        with pytest.raises(TimeoutError):
            connection.drain_events(timeout=0.01)
        assert_paused(connection, consumer, sock)
        assert channel._in_poll is pending
        _assert_next_message_waits_on_the_list(consuming)
        received[0].ack()
        for _ in range(10):
            if len(received) == 2:
                break
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=1)
        assert start.called
    assert [item.payload for item in received] == [1, 2]
    received[1].ack()
    assert _broker().hlen(channel.unacked_key) == 0
    assert _broker().llen(queue.name) == 0


def test_on_a_fair_queue_a_requeued_message_is_next_of_its_tenant() -> None:
    """Pairs with ``test_RedisPriority::test_publish_requeue_consume`` (deselected when
    every queue is fair, ``TEST_FAIR_QUEUES``); here the queue is fair in both runs.

    Stock kombu requeues with ``LPUSH``, behind the waiting messages, so two requeued
    messages keep their order. On a fair queue a requeued message goes to the front of
    its tenant's lane (behind the whole lane it would wait for its tenant's entire
    backlog), so of two requeued one after the other the second comes back first.
    Priorities still go first.
    """
    url = f"redis://{os.environ['REDIS_HOST']}:{os.environ['REDIS_6379_TCP']}"
    queue = Queue("priority_requeue_test", routing_key="priority_requeue_test", max_priority=10)
    received: list[Message] = []
    with Connection(
        url, transport=TRANSPORT_PATH, transport_options={"fair_queues": ["*"]}
    ) as conn:
        producer = Producer(conn)
        for body, priority in (("first", 6), ("second", 3), ("third", 6)):
            producer.publish(
                {"msg": body}, routing_key=queue.routing_key, declare=[queue], priority=priority
            )
        consumer = Consumer(
            conn, [queue], callbacks=[lambda body, message: received.append(message)]
        )
        with consumer:
            while len(received) < 3:
                conn.drain_events(timeout=5)
            assert [m.payload["msg"] for m in received] == ["second", "first", "third"]
            for message in received:
                message.requeue()
            received.clear()
            producer.publish(
                {"msg": "fourth"}, routing_key=queue.routing_key, declare=[queue], priority=0
            )
            while len(received) < 4:
                conn.drain_events(timeout=5)
        assert [m.payload["msg"] for m in received] == ["fourth", "second", "third", "first"]
        for message in received:
            message.ack()


def _wait_until_the_server_answered(proxy: _FreezableProxy) -> None:
    """Wait until the command the consumer sent before the freeze has been answered by
    Redis (into the void): its proxy-side connection is no longer blocked."""
    client = _broker()
    upstream = {"{}:{}".format(*pair[1].getsockname()[:2]) for pair in proxy._pairs}
    wait_until(
        lambda: (
            not any(
                entry["addr"] in upstream and "b" in entry["flags"]
                for entry in client.client_list()
            )
        ),
        timeout=10,
        interval=0.01,
        message="Redis to answer the command the frozen consumer sent",
    )


def test_half_open_connection_is_dropped_by_drain_events(connection: Connection) -> None:
    """Pairs with ``test_RedisBrpopHealthCheck::test_half_open_connection_dropped_by_drain_events``.

    The same scenario: the proxy freezes, a message waits, an idle ``drain_events()``
    must drop the half-open connection, and the next one reconnects and consumes. Two
    things differ, both about timing, not behaviour. Upstream sleeps ``brpop_timeout +
    0.5`` s for the in-flight BRPOP to be answered into the void; here the test waits
    until Redis no longer blocks that connection. And upstream freezes the health
    check's clock past the deadline of the command in flight *before* the drain; the
    platform's idle command answers within 0.1 s, so its reply may reach the client just
    before the freeze and the drain then reads it and sends the next command, which the
    frozen proxy swallows. Here the clock the check reads is past the deadline of
    whichever command is in flight when it looks, which is what "the reply is overdue"
    means.
    """
    upstream = upstream_redis.test_RedisBrpopHealthCheck()
    proxy = _FreezableProxy((os.environ["REDIS_HOST"], int(os.environ["REDIS_6379_TCP"])))
    try:
        name = f"brpop_drain_{uuid4().hex}"
        received: list[object] = []
        conn, channel, queue = upstream._consumer(connection, proxy.port, name, received)
        with conn:
            proxy.freeze()
            _wait_until_the_server_answered(proxy)
            upstream._publish(connection, queue, {"msg": "recovered"})

            deadline = channel.brpop_timeout + channel.health_check_interval
            with patch(
                "kombu.transport.redis.monotonic",
                side_effect=lambda: (channel._brpop_sent_at or 0.0) + deadline + 1,
            ):
                with pytest.raises(socket.timeout):
                    conn.drain_events(timeout=1)
                assert received == []
                assert channel.client.connection._sock is None
                assert not channel._in_poll

                for _ in range(5):
                    with contextlib.suppress(socket.timeout):
                        conn.drain_events(timeout=1)
                    if received:
                        break

            assert received == [{"msg": "recovered"}]
    finally:
        proxy.close()
