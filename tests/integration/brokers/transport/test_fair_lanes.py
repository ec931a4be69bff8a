"""Fair queues on the platform transport: tenants alternate, weights, restore, size, purge.

Real Redis, the platform transport through kombu. Messages carry the ``platform_tenant``
header as ``publish`` sets it; the order in which a fair queue hands them out is
asserted exactly.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from typing import Any

import redis
from kombu import Connection, Exchange, Producer, Queue

from platform_tasks.brokers.transport import fair_lanes
from platform_tasks.brokers.transport.fair_metrics import list_keys
from platform_tasks.headers import TENANT_HEADER
from platform_tasks.keys import fair_lane_keys
from platform_tasks.testing.servers import wait_until
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


# --- repairs: purge, fairness turned off, large sorts, requeue ------------------------


class _SortsAfterRingRead:
    """The client a purge uses, running ``race`` right after the purge reads the ring
    with a command of its own (the moment a separate read and delete leave open)."""

    def __init__(self, client: redis.Redis, race: Callable[[], None]) -> None:
        self._client = client
        self._race = race

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name != "lrange":
            return attr

        def lrange(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            self._race()
            return result

        return lrange


def test_a_sort_racing_a_purge_leaves_no_tenant_out_of_the_ring(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    """A worker's sort between the purge's reading of the ring and its deletes puts a
    new tenant on the ring; its lane must not outlive the ring it was on, or every later
    job of that tenant waits for ever."""
    conn = connect(fair_queues=["fairq"])
    _publish(conn, ["A"] * 3)
    channel = conn.default_channel
    channel.basic_consume("fairq", False, lambda message: None, "sorter")
    assert channel.sort_arrivals() == 3
    other = connect(fair_queues=["fairq"])  # another worker, sorting its arrivals
    other_channel = other.default_channel
    other_channel.basic_consume("fairq", False, lambda message: None, "other-sorter")
    raced: list[int] = []

    def race() -> None:
        if not raced:
            _publish(other, ["X"])
            raced.append(other_channel.sort_arrivals())

    purged = fair_lanes.purge_lanes(
        _SortsAfterRingRead(redis_client, race), list_keys("fairq", steps=(0,))
    )
    race()  # a purge without a separate ring read: the new job comes right after it
    assert raced == [1]
    assert purged in (3, 4)

    _publish(conn, ["X"])

    taken = _take(conn)
    assert _tenants(taken) == ["X"] * (5 - purged)


def test_a_tenant_missing_from_the_ring_is_put_back_by_the_next_sort(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    """A lane whose tenant is not on the ring (left by an interrupted purge of an
    earlier release) is taken again once its tenant's next job is sorted."""
    conn = connect(fair_queues=["fairq"])
    _publish(conn, ["X", "A"])
    channel = conn.default_channel
    channel.basic_consume("fairq", False, lambda message: None, "sorter")
    assert channel.sort_arrivals() == 2
    lane = fair_lane_keys("fairq").lane("X").encode()
    for key in redis_client.keys("fairq*"):
        if key != lane:
            redis_client.delete(key)
    assert redis_client.llen(lane) == 1

    _publish(conn, ["X", "X"])

    taken = _take(conn)
    assert [(m.decode()["tenant"], m.decode()["n"]) for m in taken] == [
        ("X", 0),
        ("X", 0),
        ("X", 1),
    ]


def test_a_worker_without_the_setting_takes_jobs_sorted_onto_lanes_after_it_started(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    """Rolling deploy turning fairness off: the new worker starts while the queue is
    empty (no ring to adopt), then an old worker sorts arrivals onto lanes and stops."""
    new = connect(fair_queues=[])
    received: list[Any] = []
    new_channel = new.default_channel
    new_channel.basic_consume("fairq", False, received.append, "new")
    assert not new_channel.fair.is_fair("fairq")

    old = connect(fair_queues=["fairq"])
    old_channel = old.default_channel
    old_channel.basic_consume("fairq", False, lambda message: None, "old")
    _publish(old, ["A", "A", "B"])
    assert old_channel.sort_arrivals() == 3
    old.release()
    assert redis_client.llen("fairq") == 0

    def drained() -> bool:
        with contextlib.suppress(socket.timeout):
            new.drain_events(timeout=0.2)
        return len(received) == 3

    wait_until(drained, timeout=10, interval=0, message="the new worker took the lanes' jobs")
    assert sorted(m.decode()["n"] for m in received) == [0, 1, 2]
    for message in received:
        message.ack()


def test_a_sort_batch_of_8000_from_one_tenant_is_sorted(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect(fair_queues=["fairq"], fair_sort_batch=8000)
    _publish(conn, ["A"])
    raw = redis_client.lindex("fairq", 0)
    assert raw is not None
    redis_client.lpush("fairq", *([raw] * 7999))
    _publish(conn, ["B"])
    channel = conn.default_channel
    channel.basic_consume("fairq", False, lambda message: None, "sorter")

    assert channel.sort_arrivals() == 8001

    first, second = channel.basic_get("fairq"), channel.basic_get("fairq")
    assert [first.decode()["tenant"], second.decode()["tenant"]] == ["A", "B"]
    assert channel._size("fairq") == 7999


def test_a_requeued_job_is_next_of_its_tenant_not_behind_its_backlog(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect(fair_queues=["fairq"])
    _publish(conn, ["A", "A", "A", "B"])
    channel = conn.default_channel
    first = channel.basic_get("fairq")
    assert first.decode() == {"n": 0, "tenant": "A"}

    first.reject(requeue=True)

    assert fair_lanes.waiting_by_tenant(redis_client, ["fairq"], 10) == {"A": 3, "B": 1}
    assert fair_lanes.waiting_in_lanes(redis_client, ["fairq"]) == 4

    rest = [(m.decode()["tenant"], m.decode()["n"]) for m in _take(conn)]
    assert rest == [("B", 3), ("A", 0), ("A", 1), ("A", 2)]


def test_a_restored_job_is_next_of_its_tenant_not_behind_its_backlog(
    connect: ConnectionFactory, redis_client: redis.Redis
) -> None:
    conn = connect(fair_queues=["fairq"], visibility_timeout=1, unacked_restore_interval=0.1)
    _publish(conn, ["A", "A", "A", "B"])
    channel = conn.default_channel
    taken = channel.basic_get("fairq")
    assert taken.decode() == {"n": 0, "tenant": "A"}
    channel.qos._delivered.clear()  # as if its worker died: nobody acks or restores it

    def restored() -> bool:
        channel.qos._last_sweep = float("-inf")
        channel.qos.restore_visible(num=10)
        return redis_client.hlen("unacked") == 0

    wait_until(restored, timeout=5, interval=0.2, message="sweep restored the message")
    rest = [(m.decode()["tenant"], m.decode()["n"]) for m in _take(conn)]
    assert rest == [("B", 3), ("A", 0), ("A", 1), ("A", 2)]
