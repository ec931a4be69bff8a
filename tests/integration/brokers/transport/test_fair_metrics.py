"""``platform_queue_waiting_by_tenant``: the largest tenants of a fair queue, bounded."""

from __future__ import annotations

import json
import time

import pytest
import redis
from kombu import Connection, Producer

from platform_tasks import create_app
from platform_tasks.brokers.queue_latency import QueueCollector
from platform_tasks.brokers.transport.fair_metrics import FairQueueCollector
from platform_tasks.headers import TENANT_HEADER
from platform_tasks.observability.trace_context import PUBLISHED_AT_HEADER
from platform_tasks.settings import PlatformSettings
from tests.integration.brokers.transport.conftest import ConnectionFactory
from tests.integration.brokers.transport.test_fair_lanes import QUEUE, _publish


def _samples(collector: FairQueueCollector) -> dict[str, float]:
    (family,) = list(collector.collect())
    return {s.labels["tenant"]: s.value for s in family.samples if s.labels["queue"] == "fairq"}


def test_waiting_by_tenant_names_the_top_tenants_and_sums_the_rest(
    connect: ConnectionFactory, redis_url: str
) -> None:
    conn: Connection = connect(fair_queues=["fairq"])
    tenants = ["big"] * 6 + ["mid"] * 4 + ["small"] * 2 + [f"t{n}" for n in range(5)] + [None]
    _publish(conn, tenants)
    settings = PlatformSettings.build(redis_url=redis_url, fair_queues="fairq", profile="test")
    collector = FairQueueCollector(create_app("fair_metrics", settings=settings), top=3)

    assert _samples(collector) == {"(other)": 0, "(arriving)": 18}

    taken = conn.default_channel.basic_get("fairq", no_ack=True)  # sorts, takes one "big"
    assert taken is not None

    assert _samples(collector) == {
        "big": 5,
        "mid": 4,
        "small": 2,
        "(other)": 6,  # t0..t4 and the job without a tenant
        "(arriving)": 0,
    }


def test_queue_length_and_latency_count_the_jobs_on_tenant_lanes(
    connect: ConnectionFactory, redis_url: str
) -> None:
    """``celery_queue_length`` and ``platform_queue_latency_seconds`` of a fair queue see
    the jobs sorted onto lanes, not only the arrivals still on the queue's list."""
    conn: Connection = connect(fair_queues=["fairq"])
    channel = conn.default_channel
    producer = Producer(channel)
    now = time.time()
    for n, (tenant, age) in enumerate([("old", 40.0), ("old", 5.0), ("new", 2.0)]):
        producer.publish(
            {"n": n},
            exchange=QUEUE.exchange,
            routing_key=QUEUE.routing_key,
            headers={TENANT_HEADER: tenant, PUBLISHED_AT_HEADER: now - age},
            declare=[QUEUE],
        )
    channel.basic_consume("fairq", False, lambda message: None, "sorter")
    assert channel.sort_arrivals() == 3  # every job is on a lane now, the list is empty

    settings = PlatformSettings.build(redis_url=redis_url, fair_queues="fairq", profile="test")
    collector = QueueCollector(create_app("fair_queue_gauges", settings=settings))
    length, ready_at = collector._redis_queue(channel, "fairq")
    assert length == 3
    assert ready_at is not None and now - ready_at == pytest.approx(40.0, abs=0.01)


def test_queue_latency_sees_the_oldest_job_whichever_of_10001_lanes_holds_it(
    connect: ConnectionFactory, redis_url: str, redis_client: redis.Redis
) -> None:
    """The oldest job waits on the lane of the 10,001st tenant to arrive: a scrape that
    reads a bounded number of lane heads off the ring misses it, one that reads the
    heads the transport keeps does not."""
    conn: Connection = connect(fair_queues=["fairq"])
    channel = conn.default_channel
    now = time.time()
    Producer(channel).publish(
        {"n": 0},
        exchange=QUEUE.exchange,
        routing_key=QUEUE.routing_key,
        headers={TENANT_HEADER: "t0", PUBLISHED_AT_HEADER: now - 1.0},
        declare=[QUEUE],
    )
    raw = redis_client.rpop("fairq")
    assert raw is not None
    message = json.loads(raw)
    copies = []
    for n in range(10_001):
        message["headers"][TENANT_HEADER] = f"t{n}"
        message["headers"][PUBLISHED_AT_HEADER] = now - (300.0 if n == 10_000 else 1.0)
        copies.append(json.dumps(message))
    for start in range(0, len(copies), 1000):
        redis_client.lpush("fairq", *copies[start : start + 1000])
    channel.basic_consume("fairq", False, lambda message: None, "sorter")
    while channel.sort_arrivals():
        continue
    assert redis_client.llen("fairq") == 0

    settings = PlatformSettings.build(redis_url=redis_url, fair_queues="fairq", profile="test")
    collector = QueueCollector(create_app("fair_queue_gauges_wide", settings=settings))
    length, ready_at = collector._redis_queue(channel, "fairq")
    assert length == 10_001
    assert ready_at is not None and now - ready_at == pytest.approx(300.0, abs=0.01)
    waiting = FairQueueCollector(create_app("fair_metrics_wide", settings=settings), top=2)
    samples = _samples(waiting)
    assert samples["(other)"] == 9_999
    assert samples["(arriving)"] == 0
    assert sum(samples.values()) == 10_001
