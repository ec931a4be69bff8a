"""A worker on RabbitMQ serves ``celery_queue_length`` from the queue's ready count; queue
latency, which needs a look at the head of the queue, is absent there (RabbitMQ cannot
show a message without delivering it), never a made-up number."""

from __future__ import annotations

import socket
import urllib.request

import redis
from prometheus_client.parser import text_string_to_metric_families

from platform_tasks import QueuePort
from platform_tasks.testing.servers import free_port, wait_until
from tests.e2e.brokers.rabbitmq.conftest import QUEUE, Workers

Samples = list[tuple[str, dict[str, str], float]]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def length(samples: Samples) -> float | None:
    found = [
        v
        for n, labels, v in samples
        if n == "celery_queue_length" and labels == {"queue_name": QUEUE}
    ]
    return found[0] if found else None


def test_queue_length_on_rabbitmq(
    port: QueuePort, workers: Workers, redis_client: redis.Redis
) -> None:
    metrics_port = free_port()
    workers.start(PLATFORM_METRICS_PORT=str(metrics_port))
    job = {"tenant_id": "t1", "kind": "tests.consumer.apply"}
    blocker = port.publish(QUEUE, {**job, "data": {"key": "block", "block": True}})
    wait_until(
        lambda: redis_client.llen("test:started") >= 1,
        timeout=60,
        message="the blocking job running",
    )
    port.publish(QUEUE, {**job, "data": {"key": "waits"}})
    wait_until(
        lambda: length(scrape(metrics_port)) == 1, timeout=30, message="the waiting job counted"
    )
    waiting = scrape(metrics_port)
    redis_client.set(f"test:release:{blocker}", 1)
    wait_until(lambda: length(scrape(metrics_port)) == 0, timeout=60, message="the queue drained")

    assert not [s for s in waiting if s[0] == "platform_queue_latency_seconds"]
    assert ("celery_worker_up", {"hostname": socket.gethostname()}, 1.0) in waiting
