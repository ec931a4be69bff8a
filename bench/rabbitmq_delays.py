"""Delays on RabbitMQ: native delayed delivery against the promoted Redis delay store.

In one run, on one RabbitMQ node and one Redis started by the harness (Redis with
``appendfsync always``, as durable as the quorum queues' synced log), each mode schedules
``--jobs`` envelopes through ``QueuePort.schedule``, each due ``--delay`` seconds after it
was scheduled, while a consumer on the job queue records arrivals; latency is the time a
message reached the consumer minus its ``run_at``:

- ``native``: ``PLATFORM_RABBITMQ_DELAYS=native`` (the countdown rounded up to whole
  seconds, RabbitMQ's delayed-delivery quorum queues);
- ``delay_store``: ``PLATFORM_RABBITMQ_DELAYS=delay_store``; the production promoter
  (:class:`~platform_tasks.publishing.rabbitmq_delay_promoter.RabbitMQDelayPromoter`) runs in a
  process of its own, as in a worker, and its CPU time per promoted job is reported.

Each mode gets a fresh virtual host. The machine is shared, so compare the two modes of
one run (the ratio) and read the load average printed with them.

    .venv/bin/python bench/rabbitmq_delays.py --jobs 10000 --delay 5
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import kombu

from platform_tasks import QueuePort, create_app
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import RedisServer, wait_until

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the suite's RabbitMQ server lives in tests/support

from tests.support.servers import RabbitMQServer  # noqa: E402

QUEUE = "bench"
MODES = ("native", "delay_store")


@dataclass
class Result:
    mode: str
    jobs: int
    arrived: int
    schedule_rate: float
    p50: float
    p99: float
    max: float
    min: float
    load_before: float
    load_after: float
    promoter_cpu_ms_per_job: float | None


def settings_for(mode: str, broker_url: str, redis_url: str) -> PlatformSettings:
    return PlatformSettings.build(
        broker_url=broker_url, redis_url=redis_url, profile="bench", rabbitmq_delays=mode
    )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def promote_forever(broker_url: str, redis_url: str) -> None:
    """``--promote``: run the production promoter until SIGTERM (a worker's promoter)."""
    from platform_tasks.publishing.rabbitmq_delay_promoter import RabbitMQDelayPromoter

    app = create_app(
        "bench_rabbitmq_delays", settings=settings_for("delay_store", broker_url, redis_url)
    )
    promoter = RabbitMQDelayPromoter(app)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    promoter.start()
    print("promoter started", flush=True)
    stopped.wait()
    promoter.stop()


def measure(
    mode: str, server: RabbitMQServer, redis_url: str, jobs: int, delay: float, workdir: Path
) -> Result:
    broker_url = server.fresh_vhost(f"bench-{mode}")
    app = create_app("bench_rabbitmq_delays", settings=settings_for(mode, broker_url, redis_url))
    port = QueuePort(app)
    due: dict[str, float] = {}
    latencies: list[float] = []
    ready = threading.Event()
    done = threading.Event()

    def consume() -> None:
        with kombu.Connection(broker_url) as conn:
            queue = kombu.Queue(
                QUEUE,
                kombu.Exchange(QUEUE, "topic"),
                QUEUE,
                queue_arguments={"x-queue-type": "quorum"},
            )

            def on_message(body: object, message: kombu.Message) -> None:
                arrived = time.time()
                job_id = message.headers["id"]
                while job_id not in due:  # scheduled, stored, not yet recorded
                    time.sleep(0.001)
                latencies.append(arrived - due[job_id])
                message.ack()

            with conn.Consumer(queue, callbacks=[on_message], prefetch_count=500):
                ready.set()
                while not done.is_set():
                    with contextlib.suppress(TimeoutError, socket.timeout):
                        conn.drain_events(timeout=1)

    promoter: subprocess.Popen[bytes] | None = None
    log = open(workdir / f"promoter-{mode}.log", "wb")  # noqa: SIM115 - closed below
    if mode == "delay_store":
        promoter = subprocess.Popen(
            [sys.executable, __file__, "--promote", broker_url, redis_url],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_until(
            lambda: b"promoter started" in (workdir / f"promoter-{mode}.log").read_bytes(),
            timeout=60,
            message="promoter started",
        )
    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    ready.wait(60)
    cpu_before = cpu_seconds(promoter.pid) if promoter else 0.0
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    for i in range(jobs):
        run_at = datetime.now(UTC) + timedelta(seconds=delay)
        job_id = port.schedule(
            QUEUE, {"tenant_id": "t", "kind": "bench.noop", "data": {"i": i}}, run_at
        )
        due[str(job_id)] = run_at.timestamp()
    scheduled_s = time.monotonic() - started
    deadline = time.monotonic() + delay + 300
    while len(latencies) < jobs and time.monotonic() < deadline:
        time.sleep(0.2)
    load_after = os.getloadavg()[0]
    cpu_ms = None
    if promoter is not None:
        cpu_ms = (cpu_seconds(promoter.pid) - cpu_before) * 1000 / max(1, len(latencies))
        promoter.terminate()
        promoter.wait(30)
    log.close()
    done.set()
    consumer.join(10)
    port.close()
    app.close()
    ordered = sorted(latencies)
    return Result(
        mode=mode,
        jobs=jobs,
        arrived=len(ordered),
        schedule_rate=jobs / scheduled_s,
        p50=statistics.median(ordered),
        p99=ordered[int(len(ordered) * 0.99) - 1],
        max=ordered[-1],
        min=ordered[0],
        load_before=load_before,
        load_after=load_after,
        promoter_cpu_ms_per_job=cpu_ms,
    )


def report(results: list[Result], delay: float) -> None:
    print(
        "\n| mode | arrived | due-to-queue p50 | p99 | max | min | scheduling | "
        "promoter CPU/job | load avg (1 min) before/after |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        cpu_ms = r.promoter_cpu_ms_per_job
        cpu = "none" if cpu_ms is None else f"{cpu_ms:.2f} ms"
        print(
            f"| {r.mode} | {r.arrived}/{r.jobs} | {r.p50:.3f} s | {r.p99:.3f} s | "
            f"{r.max:.3f} s | {r.min:.3f} s | {r.schedule_rate:.0f} jobs/s | {cpu} | "
            f"{r.load_before:.2f} / {r.load_after:.2f} |"
        )
    by_mode = {r.mode: r for r in results}
    if set(by_mode) == set(MODES):
        native, store = by_mode["native"], by_mode["delay_store"]
        print(
            f"\ndelay_store / native (delay {delay:g}s): p50 {store.p50 / native.p50:.2f}x, "
            f"p99 {store.p99 / native.p99:.2f}x, max {store.max / native.max:.2f}x, "
            f"scheduling rate {store.schedule_rate / native.schedule_rate:.2f}x"
        )


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--promote":
        promote_forever(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--delay", type=float, default=5.0)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, in order")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    base = Path(tempfile.mkdtemp(prefix="platform-bench-rmq-"))
    os.chmod(base, 0o755)
    results = []
    with RabbitMQServer(base / "rabbitmq") as server:
        redis_server = RedisServer(base / "redis", appendfsync="always").start()
        try:
            for mode in modes:
                results.append(measure(mode, server, redis_server.url, args.jobs, args.delay, base))
                r = results[-1]
                print(
                    f"{mode}: arrived={r.arrived}/{r.jobs} p50={r.p50:.3f}s "
                    f"p99={r.p99:.3f}s max={r.max:.3f}s scheduling {r.schedule_rate:.0f}/s",
                    flush=True,
                )
        finally:
            redis_server.stop()
    report(results, args.delay)


if __name__ == "__main__":
    main()
