"""Fair queues on the platform transport: tenants alternate, weights, restore, size, purge.

Real Redis, the platform transport through kombu. Messages carry the ``platform_tenant``
header as ``publish`` sets it; the order in which a fair queue hands them out is
asserted exactly.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu import Connection, Exchange, Producer, Queue

from platform_tasks.headers import TENANT_HEADER
from platform_tasks.keys import fair_lane_keys
from tests.integration.brokers.transport.conftest import ConnectionFactory

QUEUE = Queue("fairq", Exchange("fairq", type="direct"), routing_key="fairq")
PLAIN = Queue("plainq", Exchange("plainq", type="direct"), routing_key="plainq")


def _publish(conn: Connection, tenants: list[str | None], queue: Queue = QUEUE) -> None:
    producer = Producer(conn.default_channel)
    for n, tenant in enumerate(tenants):
        headers = {} if tenant is None else {TENANT_HEADER: tenant}
        producer.publish(
            {"n": n, "tenant": tenant},
            exchange=queue.exchange,
            routing_key=queue.routing_key,
            headers=headers,
            declare=[queue],
        )


def _take(conn: Connection, queue: str = "fairq", *, ack: bool = True) -> list[Any]:
    """Every message ``basic_get`` hands out, in order."""
    channel = conn.default_channel
    taken = []
    while (message := channel.basic_get(queue)) is not None:
        taken.append(message)
        if ack:
            message.ack()
    return taken


def _tenants(messages: list[Any]) -> list[str | None]:
    return [m.decode()["tenant"] for m in messages]


def test_tenants_with_work_alternate_whatever_their_backlogs(connect: ConnectionFactory) -> None:
    conn = connect(fair_queues=["fairq"])
    _publish(conn, ["A"] * 6 + ["B"] * 3 + ["C"] * 2 + [None] * 2)

    order = _tenants(_take(conn))

    assert order == ["A", "B", "C", None, "A", "B", "C", None, "A", "B", "A", "A", "A"]


def test_a_tenant_with_weight_two_gives_two_per_turn(connect: ConnectionFactory) -> None:
    conn = connect(fair_queues=["fairq"], tenant_weights={"A": 2})
    _publish(conn, ["A"] * 5 + ["B"] * 3)

    assert _tenants(_take(conn)) == ["A", "A", "B", "A", "A", "B", "A", "B"]


def test_a_weighted_tenant_that_runs_out_mid_turn_leaves_the_next_a_full_turn(
    connect: ConnectionFactory,
) -> None:
    conn = connect(fair_queues=["fairq"], tenant_weights={"A": 3, "B": 2})
    _publish(conn, ["A"] * 2 + ["B"] * 4 + ["C"])

    assert _tenants(_take(conn)) == ["A", "A", "B", "B", "C", "B", "B"]


def test_without_fairness_the_queue_is_fifo(connect: ConnectionFactory) -> None:
    conn = connect(fair_queues=[])
    _publish(conn, ["A"] * 3 + ["B"] * 2)

    assert _tenants(_take(conn)) == ["A", "A", "A", "B", "B"]


def test_a_plain_queue_beside_a_fair_one_stays_fifo(connect: ConnectionFactory) -> None:
    conn = connect(fair_queues=["fairq"])
    _publish(conn, ["A", "A", "B"], PLAIN)

    assert _tenants(_take(conn, "plainq")) == ["A", "A", "B"]


def test_size_counts_lanes_and_purge_empties_them(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect(fair_queues=["fairq"])
    _publish(conn, ["A"] * 4 + ["B"] * 2)
    channel = conn.default_channel
    first = channel.basic_get("fairq")  # sorts every arrival onto the lanes
    assert first is not None
    assert redis_client.llen("fairq") == 0

    assert channel._size("fairq") == 5
    assert channel._purge("fairq") == 5
    assert channel._size("fairq") == 0
    assert not redis_client.keys("fairq*")
    first.ack()


def test_a_rejected_message_goes_back_to_its_tenants_lane(connect: ConnectionFactory) -> None:
    conn = connect(fair_queues=["fairq"])
    _publish(conn, ["A", "A", "B"])
    channel = conn.default_channel
    first = channel.basic_get("fairq")
    assert first.decode() == {"n": 0, "tenant": "A"}

    first.reject(requeue=True)

    rest = _take(conn)
    assert sorted(m.decode()["n"] for m in rest) == [0, 1, 2]
    assert _tenants(rest) == ["B", "A", "A"]


def test_a_message_taken_and_never_acked_is_restored_by_the_sweep(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect(fair_queues=["fairq"], visibility_timeout=1, unacked_restore_interval=0.1)
    _publish(conn, ["A", "B"])
    channel = conn.default_channel
    taken = channel.basic_get("fairq")
    assert taken is not None and redis_client.hlen("unacked") == 1
    channel.qos._delivered.clear()  # as if its worker died: nobody acks or restores it

    def restored() -> bool:
        channel.qos._last_sweep = float("-inf")
        channel.qos.restore_visible(num=10)
        return redis_client.hlen("unacked") == 0

    from platform_tasks.testing.servers import wait_until

    wait_until(restored, timeout=5, interval=0.2, message="sweep restored the message")
    assert sorted(m.decode()["n"] for m in _take(conn)) == [0, 1]


def test_a_worker_without_the_setting_drains_lanes_left_behind(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    fair = connect(fair_queues=["fairq"])
    _publish(fair, ["A"] * 3 + ["B"] * 2)
    first = fair.default_channel.basic_get("fairq")
    assert first is not None
    first.ack()
    ring = fair_lane_keys("fairq").ring
    assert redis_client.exists(ring)

    plain = connect(fair_queues=[])
    channel = plain.default_channel
    received: list[Any] = []
    channel.basic_consume("fairq", False, received.append, "leftovers")
    assert channel.fair.is_fair("fairq")
    assert sorted(m.decode()["n"] for m in _take(plain)) == [1, 2, 3, 4]
    assert not redis_client.exists(ring)


def test_the_tenant_is_the_header_even_when_its_name_appears_elsewhere(
    connect: ConnectionFactory,
) -> None:
    conn = connect(fair_queues=["fairq"])
    producer = Producer(conn.default_channel)
    decoys = [
        {"meta": {TENANT_HEADER: "A"}, TENANT_HEADER: "B"},  # the key nested before it
        {"note": f'"{TENANT_HEADER}": "A"', TENANT_HEADER: "B"},  # inside a string value
    ]
    _publish(conn, ["A", "A", "A"])
    for n, headers in enumerate(decoys):
        producer.publish(
            {"n": 10 + n, "tenant": "B"},
            exchange=QUEUE.exchange,
            routing_key=QUEUE.routing_key,
            headers=headers,
        )

    assert _tenants(_take(conn)) == ["A", "B", "A", "B", "A"]


def test_sort_arrivals_sorts_a_burst_without_taking_anything(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect(fair_queues=["fairq"], fair_sort_batch=1000)
    _publish(conn, ["A"] * 2500 + ["B"])
    channel = conn.default_channel
    channel.basic_consume("fairq", False, lambda message: None, "sorter")

    assert channel.sort_arrivals() == 2501

    assert redis_client.llen("fairq") == 0
    assert redis_client.hlen("unacked") == 0
    first, second = channel.basic_get("fairq"), channel.basic_get("fairq")
    assert [first.decode()["tenant"], second.decode()["tenant"]] == ["A", "B"]
