"""A tenant's flood does not starve the others on a fair queue; on the stock path it does.

Two real ``celery worker`` processes (``-c 2``, no ``-Q``) consume the ``default`` queue.
Tenant A publishes 20,000 jobs (the platform's batched publish path, one ``LPUSH`` per
1,000), then tenants B and C publish 10 each. Every job records its start in Redis.

* ``PLATFORM_FAIR_QUEUES=default`` (platform transport): every B and C job starts
  before A's 200th job started after B began to publish.
* Fairness off (``PLATFORM_TRANSPORT=stock``: kombu's Redis transport on plain
  ``redis://``): A's next 200 jobs all start before any B or C job: starvation.

Both runs are in this one test so that it proves the difference, not each half alone.
"""

from __future__ import annotations

from pathlib import Path

import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.fanout.publisher import BatchPublisher
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.conftest import REPO_ROOT
from tests.support.processes import CeleryProcess, celery_processes, platform_env, worker_argv

QUEUE = "default"
FLOOD = 20_000
SMALL = 10
BOUND = 200
BATCH = 1_000
STARTS_KEY = "test:fair:starts"  # written by tests/apps/fair_app.py


def _publish(port: QueuePort, publisher: BatchPublisher, tenant: str, count: int) -> None:
    for start in range(0, count, BATCH):
        envelopes = [
            port.envelope({"tenant_id": tenant, "kind": "tests.fair_start", "data": {"n": n}})
            for n in range(start, min(count, start + BATCH))
        ]
        publisher.publish(envelopes)


def _starts(client: redis.Redis) -> list[str]:
    return [raw.decode().split(":", 1)[0] for raw in client.lrange(STARTS_KEY, 0, -1)]


def _run(redis_url: str, logs: Path, extra: dict[str, str]) -> tuple[int, list[str]]:
    """Start two workers, flood A, then publish B and C; returns where the start order
    stood when B began to publish and the start order once decided."""
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    settings = PlatformSettings.build(redis_url=redis_url, profile="test")
    app = create_app("fair_publisher", settings=settings)
    port = QueuePort(app)
    publisher = BatchPublisher(app, queue=QUEUE)
    env = platform_env(redis_url=redis_url, database_url=None, extra=extra)
    try:
        with celery_processes() as started:
            for name in ("w1", "w2"):
                worker = CeleryProcess(
                    worker_argv("tests.apps.fair_app", concurrency=2, hostname=f"{name}@%h"),
                    env=env,
                    cwd=REPO_ROOT,
                    log_path=logs / f"{name}.log",
                ).start()
                started.append(worker)
            for worker in started:
                worker.wait_for_log("ready.")
            _publish(port, publisher, "A", FLOOD)
            # Read before B publishes: on a fair queue B's first job can start while C's
            # are still being published, and it must count as one of B's.
            mark = int(client.llen(STARTS_KEY))
            _publish(port, publisher, "B", SMALL)
            _publish(port, publisher, "C", SMALL)

            def decided() -> bool:
                order = _starts(client)[mark:]
                others = sum(1 for tenant in order if tenant != "A")
                return others == 2 * SMALL or order.count("A") >= BOUND

            wait_until(decided, timeout=120, interval=0.05, message="B and C started or A ran on")
            return mark, _starts(client)
    finally:
        publisher.close()
        port.close()
        client.close()


def _a_before_last_other(order: list[str]) -> int:
    """A's jobs that started before the last B or C job (all of them if one is missing)."""
    last = max((i for i, tenant in enumerate(order) if tenant != "A"), default=len(order))
    if sum(1 for tenant in order if tenant != "A") < 2 * SMALL:
        last = len(order)
    return order[:last].count("A")


def test_a_flooding_tenant_does_not_starve_the_others_only_with_fairness(
    redis_url: str, tmp_path: Path
) -> None:
    mark, fair_order = _run(redis_url, tmp_path / "fair", {"PLATFORM_FAIR_QUEUES": QUEUE})
    fair_after = fair_order[mark:]
    assert fair_after.count("B") + fair_after.count("C") == 2 * SMALL, fair_after[:300]
    fair_a = _a_before_last_other(fair_after)
    assert fair_a < BOUND, f"fair: {fair_a} of A's jobs started before B and C's last"

    mark, stock_order = _run(redis_url, tmp_path / "stock", {"PLATFORM_TRANSPORT": "stock"})
    stock_after = stock_order[mark:]
    stock_a = _a_before_last_other(stock_after)
    assert stock_a >= BOUND, f"stock: B and C all started after only {stock_a} of A's jobs"
    assert stock_after[:BOUND].count("A") == BOUND, "stock: A's next 200 jobs start first"
    print(f"A's jobs started before the last B/C job: fair {fair_a}, stock >= {stock_a}")


def test_a_busy_worker_sorts_a_burst_and_a_worker_without_fairness_drains_it(
    redis_url: str, tmp_path: Path
) -> None:
    """A rolling deploy that turns fairness off, on a queue that is empty when the new
    worker starts (so it finds no lanes to adopt then).

    The new worker (no ``PLATFORM_FAIR_QUEUES``, ``-c 1``) starts and holds a job. The old
    worker (fair, ``-c 1``) starts and holds one too, so neither fetches; the old
    worker's timer still sorts a 5,000-job burst onto lanes (a new tenant is next in turn
    as soon as a process frees up, whatever the burst). Then the old worker is killed
    and the new one freed: it must take the jobs the old one left on lanes.
    """
    client = redis.Redis.from_url(redis_url)
    settings = PlatformSettings.build(redis_url=redis_url, profile="test")
    app = create_app("fair_publisher", settings=settings)
    port = QueuePort(app)

    def hold(n: int) -> None:
        port.publish(QUEUE, {"tenant_id": "A", "kind": "tests.fair_hold", "data": {"n": n}})
        wait_until(lambda: client.llen(STARTS_KEY) == n + 1, timeout=30, message=f"held {n}")

    try:
        with celery_processes() as started:
            for name, fair in (("new", ""), ("old", QUEUE)):
                env = platform_env(
                    redis_url=redis_url,
                    database_url=None,
                    extra={"PLATFORM_FAIR_QUEUES": fair},
                )
                worker = CeleryProcess(
                    worker_argv("tests.apps.fair_app", concurrency=1, hostname=f"{name}@%h"),
                    env=env,
                    cwd=REPO_ROOT,
                    log_path=tmp_path / f"{name}.log",
                ).start()
                started.append(worker)
                worker.wait_for_log("ready.")
                hold(len(started) - 1)
            old = started[1]
            publisher = BatchPublisher(app, queue=QUEUE)
            envelopes = [
                port.envelope({"tenant_id": "B", "kind": "tests.fair_start", "data": {"n": n}})
                for n in range(5_000)
            ]
            publisher.publish(envelopes)
            publisher.close()

            wait_until(
                lambda: client.llen(QUEUE) == 0,
                timeout=30,
                message="arrivals sorted while the only processes are busy",
            )
            assert client.llen(STARTS_KEY) == 2, "nothing else started meanwhile"
            old.kill_group()
            # the killed process's blocked BLPOP must be gone from Redis before the release:
            # Redis would hand the value to a connection it has not yet seen close
            wait_until(
                lambda: sum(c.get("cmd") == "blpop" for c in client.client_list()) == 1,
                timeout=30,
                message="only the new worker's held job still waits for its release",
            )
            client.rpush("test:fair:hold", 1)

            wait_until(
                lambda: client.llen(STARTS_KEY) >= 2 + 50,
                timeout=30,
                message="the worker without fairness took jobs from the lanes",
            )
    finally:
        port.close()
        client.close()
