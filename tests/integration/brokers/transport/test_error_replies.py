"""A broker answering error replies (OOM under ``maxmemory 1``) does not end the worker.

A real ``celery worker`` (prefork ``-c 2``, acks late, the platform transport) consumes
from a private Redis whose ``maxmemory`` is set to 1 byte (``noeviction``) for a while
under a backlog of jobs: commands that may grow memory (the idle wait's ``BLMOVE``, a
record written outside the fetch script, the in-flight extension) are answered
``-OOM``. The worker must ride that out as it rides out a disconnect and apply every
job once memory is back.

Non-default setup (why): the broker is a private server (``PLATFORM_BROKER_URL``) since
the test starves it of memory; the job counters live on the shared Redis
(``PLATFORM_REDIS_URL``) so the accounting keeps working meanwhile.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

from platform_tasks import create_app
from platform_tasks.brokers.transport import TRANSPORT_PATH
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.conftest import ServerFactory
from tests.integration.brokers.transport.helpers import collector, drain_until
from tests.support.processes import CeleryProcess, platform_env, worker_argv

REPO_ROOT = Path(__file__).resolve().parents[4]
JOBS = 40
LATE_JOBS = 10  # published once memory is back: the consumer must have resumed
APPLIED_KEY = "test:transport:applied"  # written by worker_app.py
ERROR_LOG = "broker answered an error reply"


def _error_replies(worker: CeleryProcess) -> int:
    return worker.log().count(ERROR_LOG)


@pytest.mark.timeout(180)
def test_worker_survives_oom_replies_and_applies_every_job(
    server_factory: ServerFactory, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    broker = server_factory.redis()
    broker_client = redis.Redis.from_url(broker.url)
    env = platform_env(
        redis_url=redis_url, database_url=None, extra={"PLATFORM_BROKER_URL": broker.url}
    )
    worker = CeleryProcess(
        worker_argv("tests.integration.brokers.transport.worker_app", concurrency=2),
        env=env,
        cwd=REPO_ROOT,
        log_path=tmp_path / "worker.log",
    ).start()
    settings = PlatformSettings.build(redis_url=redis_url, broker_url=broker.url, profile="test")
    app = create_app("oom-publisher", settings=settings, task_send_sent_event=False)
    try:
        worker.wait_for_log("ready.", timeout=90)

        def publish(numbers: range) -> None:
            with app.producer_or_acquire() as producer:
                for n in numbers:
                    app.send_task("transport_faults.count", args=[n, 0.05], producer=producer)

        publish(range(JOBS - LATE_JOBS))

        def applied() -> int:
            return int(redis_client.hlen(APPLIED_KEY))

        wait_until(lambda: applied() >= 5, timeout=60, message="first jobs applied")
        broker_client.config_set("maxmemory", 1)
        try:
            # Starved until the worker has met several error replies (the backlog drains
            # meanwhile: fetching frees memory, so the fetch script still runs, and the
            # idle wait is then refused) or has died.
            def starved_long_enough() -> bool:
                if not worker.running or "Unrecoverable error" in worker.log():
                    raise AssertionError(f"worker exited:\n{worker.log()[-4000:]}")
                return _error_replies(worker) >= 3

            try:
                wait_until(
                    starved_long_enough,
                    timeout=60,
                    interval=0.1,
                    message="the worker to meet error replies",
                )
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{worker.log()[-4000:]}") from exc
        finally:
            broker_client.config_set("maxmemory", 0)
        publish(range(JOBS - LATE_JOBS, JOBS))
        worker.wait_for_log("consuming resumes", timeout=60)
        wait_until(lambda: applied() == JOBS, timeout=60, message="every job applied")
        assert worker.running, worker.log()[-4000:]
        wait_until(
            lambda: broker_client.hlen("unacked") == 0, timeout=30, message="every message acked"
        )
        counts = {int(k): int(v) for k, v in redis_client.hgetall(APPLIED_KEY).items()}
        assert sorted(counts) == list(range(JOBS))
        assert broker_client.llen("default") == 0
    finally:
        worker.stop(timeout=20)


def test_error_reply_while_waiting_backs_off_and_keeps_consuming(
    server_factory: ServerFactory,
) -> None:
    """Without an event loop too: ``drain_events`` meets the refused wait, backs off
    and takes the message published once memory is back."""
    broker = server_factory.redis()
    client = redis.Redis.from_url(broker.url)
    conn = Connection(broker.url, transport=TRANSPORT_PATH)
    queue = Queue("jobs", Exchange("jobs"), "jobs")
    received, on_message = collector()
    try:
        with Consumer(conn, [queue], callbacks=[on_message]):
            channel = conn.default_channel
            client.config_set("maxmemory", 1)
            try:
                drain_until(conn, lambda: getattr(channel, "error_replies", 0) >= 2, timeout=30)
            finally:
                client.config_set("maxmemory", 0)
            Producer(conn.channel()).publish({"n": 1}, exchange=queue.exchange, routing_key="jobs")
            drain_until(conn, lambda: len(received) == 1, timeout=30)
            assert client.hlen("unacked") == 1
            received[0].ack()
        assert client.hlen("unacked") == 0
    finally:
        conn.release()


def _replicate(replica: redis.Redis, master_port: int) -> None:
    replica.replicaof("127.0.0.1", master_port)
    wait_until(
        lambda: replica.info("replication").get("master_link_status") == "up",
        timeout=30,
        message="replication link up",
    )


def test_ack_refused_by_a_read_only_broker_is_resent_once_it_accepts_writes(
    server_factory: ServerFactory,
) -> None:
    """``READONLY``: the broker became a replica (a failover) while a message was held.

    The ack is refused; its record must stay (nothing is lost) and the ack is resent by
    the transport's timer once the broker takes writes again. Consuming meanwhile meets
    error replies instead of ending the consumer. The timer is ticked explicitly.
    """
    broker, other = server_factory.redis(), server_factory.redis()
    client, other_client = redis.Redis.from_url(broker.url), redis.Redis.from_url(other.url)
    conn = Connection(broker.url, transport=TRANSPORT_PATH)
    queue = Queue("jobs", Exchange("jobs"), "jobs")
    received, on_message = collector()
    try:
        Producer(conn.channel()).publish(
            {"n": 1}, exchange=queue.exchange, routing_key="jobs", declare=[queue]
        )
        with Consumer(conn, [queue], callbacks=[on_message]):
            channel = conn.default_channel
            drain_until(conn, lambda: len(received) == 1)
            tag = received[0].delivery_tag
            # Fail over: the other server takes a copy and is promoted; the broker
            # becomes its read-only replica, still holding the record.
            _replicate(other_client, broker.port)
            wait_until(
                lambda: other_client.hexists("unacked", tag),
                timeout=30,
                message="the record replicated",
            )
            other_client.replicaof("NO", "ONE")
            _replicate(client, other.port)

            received[0].ack()
            assert client.hexists("unacked", tag)
            assert channel.qos.unsent_acks == {tag}
            drain_until(conn, lambda: channel.error_replies >= 2, timeout=30)

            client.replicaof("NO", "ONE")
            conn.transport.tend_in_flight()
            assert not client.hexists("unacked", tag)
            assert channel.qos.unsent_acks == set()
            Producer(conn.channel()).publish({"n": 2}, exchange=queue.exchange, routing_key="jobs")
            drain_until(conn, lambda: len(received) == 2, timeout=30)
            received[1].ack()
        assert client.hlen("unacked") == 0
    finally:
        conn.release()
