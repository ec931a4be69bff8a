"""Publish-to-start latency and gaps between task starts: platform transport vs stock.

Two runs per transport, same worker command as ``bench/transport_throughput.py``
(``celery worker -P prefork -c 2``, acks late, prefetch multiplier 1):

* ``drain``: ``--messages`` stamping tasks pre-filled, then drained; reports the gaps
  between consecutive task starts (a consume loop that stalls shows gaps of its wait
  timeout, 0.25 s or 1 s).
* ``trickle``: one task published every ``--interval`` seconds onto an idle worker (plus
  optionally a share with a priority, which lands on another priority list); reports the
  publish-to-start latency.
* ``idle``: main-process CPU of the idle worker over ``--idle`` seconds (the cost of
  waiting).

    .venv/bin/python bench/transport_latency.py --messages 2000 --trickle 300
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from platform_tasks import create_app  # noqa: E402
from platform_tasks.settings import PlatformSettings  # noqa: E402
from platform_tasks.testing.servers import PostgresServer, RedisServer, wait_until  # noqa: E402
from tests.support.processes import CeleryProcess, platform_env, worker_argv  # noqa: E402

QUEUE = "default"
STALL = 0.2
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def summary(label: str, values: list[float]) -> str:
    values = sorted(values)
    q = statistics.quantiles(values, n=100) if len(values) > 1 else values * 99
    stalls = sum(1 for v in values if v >= STALL)
    return (
        f"{label:34s} n={len(values):5d} p50={q[49] * 1000:7.2f} ms "
        f"p99={q[98] * 1000:7.2f} ms max={values[-1] * 1000:7.1f} ms "
        f">= {STALL * 1000:.0f} ms: {stalls}"
    )


def stamps(client: redis.Redis) -> list[tuple[float, float]]:
    pairs = []
    for raw in client.lrange("bench:stamps", 0, -1):
        sent, started = raw.split()
        pairs.append((float(sent), float(started)))
    return pairs


def run(
    transport: str, redis_url: str, database_url: str, args: argparse.Namespace, logs: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    settings = PlatformSettings.build(
        redis_url=redis_url, database_url=database_url, profile="bench", transport=transport
    )
    app = create_app(f"latency-{transport}", settings=settings)
    env = platform_env(
        redis_url=redis_url,
        database_url=database_url,
        extra={"PLATFORM_TRANSPORT": transport},
        pythonpath=[REPO],
    )
    argv = worker_argv("bench.transport_bench_app", concurrency=2, extra=["--without-heartbeat"])
    with app.producer_or_acquire() as producer:
        for _ in range(args.messages):
            app.send_task("bench.stamp", args=[time.time()], queue=QUEUE, producer=producer)
    log = logs / f"{transport}-{time.monotonic_ns()}.log"
    worker = CeleryProcess(argv, env=env, cwd=REPO, log_path=log).start()
    try:
        wait_until(
            lambda: client.llen("bench:stamps") >= args.messages,
            timeout=300,
            interval=0.01,
            message="drain",
        )
        starts = sorted(started for _, started in stamps(client))
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        print(summary(f"{transport} drain: gap between starts", gaps), flush=True)
        client.delete("bench:stamps")
        with app.producer_or_acquire() as producer:
            for n in range(args.trickle):
                priority = 5 if args.priority_every and n % args.priority_every == 0 else None
                app.send_task(
                    "bench.stamp",
                    args=[time.time()],
                    queue=QUEUE,
                    producer=producer,
                    priority=priority,
                )
                time.sleep(args.interval)  # pacing the publisher, not synchronisation
        wait_until(
            lambda: client.llen("bench:stamps") >= args.trickle,
            timeout=300,
            interval=0.01,
            message="trickle",
        )
        latencies = [started - sent for sent, started in stamps(client)]
        print(summary(f"{transport} trickle: publish->start", latencies), flush=True)
        if args.idle:
            cpu_start = cpu_seconds(worker.pid)
            time.sleep(args.idle)  # the measured idle period
            used = (cpu_seconds(worker.pid) - cpu_start) * 1000 / args.idle
            print(
                f"{transport + ' idle:':34s} main-process CPU {used:.2f} ms per second", flush=True
            )
    finally:
        worker.stop(timeout=15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--trickle", type=int, default=300)
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument(
        "--priority-every",
        type=int,
        default=0,
        help="every Nth trickled task gets priority 5 (another list)",
    )
    parser.add_argument(
        "--idle", type=float, default=10.0, help="seconds of idle worker, main-process CPU measured"
    )
    parser.add_argument("--transports", default="stock,platform")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    os.chmod(base, 0o755)
    redis_server = RedisServer(base / "redis").start()
    postgres = PostgresServer(base / "pg" / "data").start()
    try:
        for transport in args.transports.split(","):
            run(transport, redis_server.url, postgres.url, args, base)
    finally:
        postgres.close()
        redis_server.stop()


if __name__ == "__main__":
    main()
