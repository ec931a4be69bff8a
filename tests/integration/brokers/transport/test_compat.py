"""What users configure keeps working: prefixes, priorities, fanout, several queues,
stock workers on the same broker, and messages pushed straight onto a queue list."""

from __future__ import annotations

import json

import redis
from kombu import Consumer, Exchange, Producer, Queue

from platform_tasks.headers import UNREADABLE_HEADER
from platform_tasks.keys import TRANSPORT_LEGACY_QUARANTINE
from tests.integration.brokers.transport.conftest import ConnectionFactory
from tests.integration.brokers.transport.helpers import collector, drain_until, queued


def _queue(name: str) -> Queue:
    return Queue(name, Exchange(name), name)


def test_global_keyprefix_applies_to_every_key(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect(global_keyprefix="tenant_a:")
    queue = _queue("jobs")
    Producer(conn.channel()).publish(
        {"n": 1}, exchange=queue.exchange, routing_key="jobs", declare=[queue]
    )
    assert redis_client.llen("tenant_a:jobs") == 1
    received, on_message = collector()
    with Consumer(conn, [queue], callbacks=[on_message]):
        drain_until(conn, lambda: len(received) == 1)
        tag = received[0].delivery_tag
        assert redis_client.hexists("tenant_a:unacked", tag)
        assert redis_client.zscore("tenant_a:unacked_index", tag) is not None
        assert not redis_client.exists("unacked", "jobs")
        received[0].reject(requeue=True)
        assert queued(redis_client, "tenant_a:jobs") == 1
        drain_until(conn, lambda: len(received) == 2)
        received[1].ack()
    unprefixed = [k for k in redis_client.keys("*") if not k.startswith(b"tenant_a:")]
    assert unprefixed == []


def test_priorities_use_kombu_lists_and_order(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect(priority_steps=[0, 5, 9])
    queue = _queue("jobs")
    producer = Producer(conn.channel())
    for priority in (9, 5, 0):
        producer.publish(
            {"priority": priority},
            exchange=queue.exchange,
            routing_key="jobs",
            declare=[queue],
            priority=priority,
        )
    assert redis_client.llen("jobs") == 1
    assert redis_client.llen("jobs\x06\x165") == 1
    assert redis_client.llen("jobs\x06\x169") == 1
    received, on_message = collector()
    with Consumer(conn, [queue], callbacks=[on_message], prefetch_count=1):
        for expected in (1, 2, 3):
            drain_until(conn, lambda n=expected: len(received) == n)  # type: ignore[misc]
            received[-1].ack()
    # kombu's Redis priorities: the lowest number is taken first.
    assert [m.payload["priority"] for m in received] == [0, 5, 9]


def test_restored_message_goes_back_to_its_priority_list(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect()
    queue = _queue("jobs")
    Producer(conn.channel()).publish(
        {"n": 1}, exchange=queue.exchange, routing_key="jobs", declare=[queue], priority=6
    )
    received, on_message = collector()
    with Consumer(conn, [queue], callbacks=[on_message]):
        drain_until(conn, lambda: len(received) == 1)
        received[0].reject(requeue=True)
        assert queued(redis_client, "jobs\x06\x166") == 1
        drain_until(conn, lambda: len(received) == 2)
        received[1].ack()


def test_several_queues_are_all_consumed(connect: ConnectionFactory) -> None:
    conn = connect()
    queues = [_queue(name) for name in ("alpha", "beta", "gamma")]
    received, on_message = collector()
    with Consumer(conn, queues, callbacks=[on_message]):
        # Published while the consumer already waits, on each of the queues.
        producer = Producer(connect().channel())
        for queue in queues:
            producer.publish(
                {"q": queue.name}, exchange=queue.exchange, routing_key=queue.routing_key
            )
        drain_until(conn, lambda: len(received) == 3)
        for message in received:
            message.ack()
    assert sorted(m.payload["q"] for m in received) == ["alpha", "beta", "gamma"]


def test_message_published_while_waiting_wakes_the_consumer(connect: ConnectionFactory) -> None:
    # One list consumed, so the wait blocks for the full 30 s polling interval: receiving
    # within 5 s means the push woke it.
    conn = connect(priority_steps=[0], polling_interval=30)
    queue = _queue("jobs")
    received, on_message = collector()
    with Consumer(conn, [queue], callbacks=[on_message]):
        channel = conn.default_channel
        drain_until(conn, lambda: channel._wait_next and channel._in_poll, timeout=5)
        Producer(connect().channel()).publish({"n": 1}, exchange=queue.exchange, routing_key="jobs")
        drain_until(conn, lambda: len(received) == 1, timeout=5)
        received[0].ack()


def _waits(redis_client: redis.Redis) -> int:
    """How many blocking waits (BLMOVE) the server has run so far."""
    stats = redis_client.info("commandstats").get("cmdstat_blmove", {})
    return int(stats.get("calls", 0))


def test_message_on_another_priority_list_is_not_held_by_the_wait(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    # The wait blocks on one list; with several lists it is short whatever the polling
    # interval, so a message on another list is taken at the next fetch, not after 30 s.
    conn = connect(priority_steps=[0, 5, 9], polling_interval=30)
    queue = _queue("jobs")
    received, on_message = collector()
    producer = Producer(connect(priority_steps=[0, 5, 9]).channel())
    with Consumer(conn, [queue], callbacks=[on_message]):
        for priority in (9, 0, 5):
            before = _waits(redis_client)
            drain_until(conn, lambda: _waits(redis_client) > before, timeout=5)  # noqa: B023
            producer.publish(
                {"priority": priority},
                exchange=queue.exchange,
                routing_key="jobs",
                priority=priority,
            )
            count = len(received) + 1
            drain_until(conn, lambda: len(received) == count, timeout=5)  # noqa: B023
            received[-1].ack()
    assert [m.payload["priority"] for m in received] == [9, 0, 5]


def test_fanout_reaches_every_bound_queue(connect: ConnectionFactory) -> None:
    exchange = Exchange("broadcast", type="fanout")
    first_conn, second_conn = connect(), connect()
    first_q = Queue("listener-1", exchange, auto_delete=True)
    second_q = Queue("listener-2", exchange, auto_delete=True)
    first, on_first = collector()
    second, on_second = collector()
    with (
        Consumer(first_conn, [first_q], callbacks=[on_first], no_ack=True),
        Consumer(second_conn, [second_q], callbacks=[on_second]),
    ):
        # Subscriptions are made on the first poll; publish once both listen.
        drain_until(first_conn, lambda: first_conn.default_channel._in_listen, timeout=5)
        drain_until(second_conn, lambda: second_conn.default_channel._in_listen, timeout=5)
        Producer(connect().channel()).publish(
            {"hello": "all"}, exchange=exchange, declare=[exchange]
        )
        drain_until(first_conn, lambda: len(first) == 1)
        drain_until(second_conn, lambda: len(second) == 1)
        second[0].ack()
    assert first[0].payload == second[0].payload == {"hello": "all"}


def test_stock_and_platform_workers_share_a_broker(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    queue = _queue("jobs")
    Producer(connect(stock=True).channel()).publish(
        {"from": "stock"}, exchange=queue.exchange, routing_key="jobs", declare=[queue]
    )
    ours = connect(visibility_timeout=1)
    received, on_message = collector()
    consumer = Consumer(ours, [queue], callbacks=[on_message])
    consumer.consume()
    drain_until(ours, lambda: len(received) == 1)
    ours.default_channel.do_restore = False
    ours.release()
    # A stock worker's sweep understands our unacked record and restores it.
    stock = connect(stock=True, visibility_timeout=1, unacked_restore_throttle=1)
    restored, on_restored = collector()
    with Consumer(stock, [queue], callbacks=[on_restored]):
        drain_until(stock, lambda: len(restored) == 1, timeout=15)
        assert restored[0].payload == {"from": "stock"}
        restored[0].ack()
    assert redis_client.hlen("unacked") == 0


def test_message_pushed_straight_onto_the_list_is_consumed(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    """The delay store's script LPUSHes finished wire messages onto queue lists."""

    class Capture:
        commands: list[tuple[str, tuple[object, ...]]] = []

        def add(self, name: str, *args: object) -> None:
            self.commands.append((name, args))

    conn = connect()
    queue = _queue("jobs")
    channel = conn.channel()
    queue(channel).declare()
    capture = Capture()
    message = channel.prepare_message(json.dumps({"n": 7}), 0, "application/json", "utf-8", {}, {})
    channel.basic_publish(message, exchange="jobs", routing_key="jobs", _publish_batch=capture)
    [(name, (key, wire))] = capture.commands
    assert (name, key) == ("lpush", "jobs")
    assert redis_client.llen("jobs") == 0
    redis_client.lpush(key, wire)
    received, on_message = collector()
    with Consumer(conn, [queue], callbacks=[on_message]):
        drain_until(conn, lambda: len(received) == 1)
        assert received[0].payload == {"n": 7}
        received[0].ack()


def test_unreadable_message_is_delivered_wrapped_not_dropped(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    """Not JSON, JSON without a delivery tag, and an item an earlier version set aside: each
    is delivered in a wrapper (its bytes as the body, the reason in a header) and recorded
    as unacked like any message; nothing is left in a side list."""
    conn = connect()
    queue = _queue("jobs")
    queue(conn.channel()).declare()
    redis_client.lpush("jobs", b"\xff\xfenot json at all")
    redis_client.lpush("jobs", b'{"no": "delivery tag"}')
    redis_client.lpush(TRANSPORT_LEGACY_QUARANTINE, b"kept by an old version")
    Producer(conn.channel()).publish({"n": 1}, exchange=queue.exchange, routing_key="jobs")
    received, on_message = collector()
    with Consumer(conn, [queue], callbacks=[on_message]):
        drain_until(conn, lambda: len(received) == 4)
        assert redis_client.hlen("unacked") == 4
        for message in received:
            message.ack()
    assert redis_client.hlen("unacked") == 0
    wrapped = [
        (m.headers.get(UNREADABLE_HEADER), m.body, m.delivery_info["routing_key"])
        for m in received
        if UNREADABLE_HEADER in m.headers
    ]
    assert wrapped == [
        ("set aside by an earlier version of the transport", b"kept by an old version", "jobs"),
        ("not a JSON object", b"\xff\xfenot json at all", "jobs"),
        ("JSON without a kombu delivery tag", b'{"no": "delivery tag"}', "jobs"),
    ]
    assert [m.payload for m in received if UNREADABLE_HEADER not in m.headers] == [{"n": 1}]
    assert redis_client.exists(TRANSPORT_LEGACY_QUARANTINE) == 0


def test_consuming_survives_a_flushed_script_cache(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect()
    queue = _queue("jobs")
    producer = Producer(conn.channel())
    producer.publish({"n": 1}, exchange=queue.exchange, routing_key="jobs", declare=[queue])
    received, on_message = collector()
    with Consumer(conn, [queue], callbacks=[on_message]):
        drain_until(conn, lambda: len(received) == 1)
        redis_client.script_flush()
        received[0].ack()
        producer.publish({"n": 2}, exchange=queue.exchange, routing_key="jobs")
        drain_until(conn, lambda: len(received) == 2)
        received[1].ack()
    assert redis_client.hlen("unacked") == 0


def _command_calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def test_no_transactions_and_one_client_per_message_path(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect()
    queue = _queue("jobs")
    producer = Producer(conn.channel())
    producer.publish({"n": 0}, exchange=queue.exchange, routing_key="jobs", declare=[queue])
    channel = conn.default_channel
    with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
        assert first is second
    received, on_message = collector()
    with Consumer(conn, [queue], callbacks=[on_message]):
        redis_client.config_resetstat()  # count from here: publishes, fetches, acks
        for n in range(1, 20):
            producer.publish({"n": n}, exchange=queue.exchange, routing_key="jobs")
        drain_until(conn, lambda: len(received) == 20)
        for message in received:
            message.ack()
    calls = _command_calls(redis_client)
    assert calls.get("multi", 0) == 0
    assert calls.get("exec", 0) == 0
    assert calls["evalsha"] >= 40  # one fetch and one ack script per message
