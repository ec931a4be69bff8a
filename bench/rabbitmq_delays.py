"""Due-to-queue latency of delayed jobs on RabbitMQ (native delayed delivery).

Schedules ``--jobs`` envelopes through ``QueuePort.schedule`` on a RabbitMQ node started by
the harness, each due ``--delay`` seconds after it was scheduled, while a consumer on the
job queue records arrivals: latency is the time a message reached the consumer minus its
``run_at``.
Whole-second rounding (up) is part of what is measured.

    .venv/bin/python bench/rabbitmq_delays.py --jobs 10000 --delay 5
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import kombu

from platform_tasks import QueuePort, create_app
from platform_tasks.harness import RabbitMQServer
from platform_tasks.settings import PlatformSettings

QUEUE = "bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--delay", type=float, default=5.0)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="platform-bench-rmq-"))
    os.chmod(base, 0o755)
    with RabbitMQServer(base / "rabbitmq") as server:
        settings = PlatformSettings.build(broker_url=server.url, profile="bench")
        app = create_app("bench_rabbitmq_delays", settings=settings)
        port = QueuePort(app)
        due: dict[str, float] = {}
        latencies: list[float] = []
        ready = threading.Event()
        done = threading.Event()

        def consume() -> None:
            with kombu.Connection(server.url) as conn:
                queue = kombu.Queue(QUEUE, kombu.Exchange(QUEUE, "topic"), QUEUE,
                                    queue_arguments={"x-queue-type": "quorum"})  # fmt: skip

                def on_message(body: object, message: kombu.Message) -> None:
                    arrived = time.time()
                    job_id = message.headers["id"]
                    while job_id not in due:  # scheduled, confirmed, not yet recorded
                        time.sleep(0.001)
                    latencies.append(arrived - due[job_id])
                    message.ack()

                with conn.Consumer(queue, callbacks=[on_message], prefetch_count=500):
                    ready.set()
                    while not done.is_set():
                        with contextlib.suppress(TimeoutError, socket.timeout):
                            conn.drain_events(timeout=1)

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        ready.wait(60)
        started = time.monotonic()
        for i in range(args.jobs):
            run_at = datetime.now(UTC) + timedelta(seconds=args.delay)
            job_id = port.schedule(QUEUE, {"tenant_id": "t", "kind": "bench.noop",
                                           "data": {"i": i}}, run_at)  # fmt: skip
            due[str(job_id)] = run_at.timestamp()
        scheduled_s = time.monotonic() - started
        deadline = time.monotonic() + args.delay + 300
        while len(latencies) < args.jobs and time.monotonic() < deadline:
            time.sleep(0.2)
        done.set()
        consumer.join(10)
        port.close()
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    print(f"jobs={args.jobs} delay={args.delay}s scheduled in {scheduled_s:.1f}s "
          f"({args.jobs / scheduled_s:.0f}/s with publisher confirms)")  # fmt: skip
    print(f"arrived={len(latencies)} due-to-queue latency p50={p50:.3f}s p99={p99:.3f}s "
          f"max={latencies[-1]:.3f}s min={latencies[0]:.3f}s")  # fmt: skip


if __name__ == "__main__":
    main()
