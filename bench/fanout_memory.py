"""Peak Redis memory of a large fan-out, with and without the queue bound.

Run: .venv/bin/python bench/fanout_memory.py [--tenants 1000000] [--drain-rate 3000]

For each mode a fresh Redis (``maxmemory-policy noeviction``, no ``maxmemory``, so the
peak can be measured instead of the fan-out failing) and the same PostgreSQL with
``--tenants`` rows in ``core.tenants``. A child process runs the fan-out consumer's code
for one fan-out job; meanwhile this process stands in for the tenants' consumers, slower
than the fan-out publishes: it removes ``--drain-rate`` messages a second from the queue
(``RPOP`` with a count every 10 ms), and samples ``LLEN`` and ``used_memory`` every 10 ms.
Reported per mode: wall time until the queue is empty, the largest queue depth sampled,
``INFO memory used_memory_peak`` minus ``used_memory`` before the fan-out, and the same
from the samples.

Modes: ``unbounded`` sets ``PLATFORM_FANOUT_MAX_QUEUE_DEPTH`` to 10,000,000 (above any
tenant count here: the bound is never reached, which is how every fan-out published
before the bound existed); ``bounded`` keeps the default (10,000) or ``--bound``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2
import redis

from bench._servers import bench_postgres, bench_redis

JOB = "bench.fanout_memory"
KIND = "bench.tenant_work"
QUEUE = "bench_work"
POINT = datetime(2025, 1, 1, 0, 0, tzinfo=UTC)
UNBOUNDED = 10_000_000


def child(redis_url: str, database_url: str, bound: int) -> None:
    """One fan-out in this process, delivered again while its queue stays full."""
    from platform_tasks.envelope import parse_envelope
    from platform_tasks.errors import Throttled
    from platform_tasks.fanout import FANOUT_KIND, FanOutRequest, fan_out_job_id
    from platform_tasks.fanout.consumer import run_fan_out
    from platform_tasks.settings import PlatformSettings
    from platform_tasks.testing import create_test_app

    settings = PlatformSettings.build(
        redis_url=redis_url,
        database_url=database_url,
        profile="bench",
        fanout_max_queue_depth=bound,
    )
    app = create_test_app("bench_fanout_memory", settings=settings)
    job_id = fan_out_job_id(JOB, POINT, KIND)
    envelope = parse_envelope(
        {
            "job_id": str(job_id),
            "tenant_id": "platform",
            "correlation_id": f"fanout-{job_id}",
            "kind": FANOUT_KIND,
            "data": {
                "job": JOB,
                "point": POINT.isoformat(),
                "queue": QUEUE,
                "kind": KIND,
                "data": {"window_days": 7},
            },
        },
        FanOutRequest,
    )
    deliveries = 0
    while True:
        deliveries += 1
        try:
            result = run_fan_out(app, envelope, settings=settings)  # type: ignore[arg-type]
        except Throttled:  # the queue stayed full: the worker would deliver it again later
            continue
        print(json.dumps({"published_total": result.published_total, "deliveries": deliveries}))
        return


class Consumers(threading.Thread):
    """Removes ``rate`` messages a second from the queue; samples depth and memory."""

    def __init__(self, redis_url: str, rate: int) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(redis_url)
        self.rate = rate
        self.removed = 0
        self.largest_depth = 0
        self.largest_memory = 0
        self.stop = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - started) * self.rate) - self.removed
            if due > 0:
                popped = self.client.rpop(QUEUE, due) or []
                self.removed += len(popped)
            pipe = self.client.pipeline(transaction=False)
            pipe.llen(QUEUE)
            pipe.info("memory")
            depth, memory = pipe.execute()
            self.largest_depth = max(self.largest_depth, int(depth))
            self.largest_memory = max(self.largest_memory, int(memory["used_memory"]))
            time.sleep(0.01)


def run_mode(database_url: str, tenants: int, bound: int, rate: int) -> dict[str, float]:
    with bench_redis() as server:
        client = redis.Redis.from_url(server.url)
        client.config_set("maxmemory-policy", "noeviction")
        baseline = int(client.info("memory")["used_memory"])
        consumers = Consumers(server.url, rate)
        consumers.start()
        start = time.monotonic()
        out = subprocess.run(
            [sys.executable, __file__, "--child", server.url, database_url, str(bound)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        report = json.loads(out.strip().splitlines()[-1])
        while client.llen(QUEUE) > 0:
            time.sleep(0.05)
        seconds = time.monotonic() - start
        consumers.stop.set()
        consumers.join()
        peak = int(client.info("memory")["used_memory_peak"])
        client.close()
    assert report["published_total"] == tenants == consumers.removed, (report, consumers.removed)
    return {
        "seconds": seconds,
        "largest_depth": consumers.largest_depth,
        "peak_mib": (peak - baseline) / 2**20,
        "sampled_mib": (consumers.largest_memory - baseline) / 2**20,
        "deliveries": report["deliveries"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=1_000_000)
    parser.add_argument(
        "--drain-rate",
        type=int,
        default=3000,
        help="messages a second the stand-in consumers remove",
    )
    parser.add_argument(
        "--bound",
        type=int,
        default=None,
        help="PLATFORM_FANOUT_MAX_QUEUE_DEPTH of the bounded run (default 10,000)",
    )
    parser.add_argument("--modes", default="unbounded,bounded")
    parser.add_argument(
        "--child", nargs=3, metavar=("REDIS_URL", "DATABASE_URL", "BOUND"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    from platform_tasks.postgres.migrations import migrate
    from platform_tasks.settings import PlatformSettings

    bound = args.bound or PlatformSettings.build().fanout_max_queue_depth
    with bench_postgres() as pserver:
        migrate(pserver.url)
        conn = psycopg2.connect(pserver.url)
        with conn, conn.cursor() as cur:
            cur.execute(
                "INSERT INTO core.tenants (tenant_id, freshness_tier) "
                "SELECT 't-' || lpad(n::text, 7, '0'), 'nightly' "
                "FROM generate_series(0, %s - 1) AS n",
                (args.tenants,),
            )
            cur.execute("ANALYZE core.tenants")
        conn.close()
        print(f"{args.tenants:,} tenants, stand-in consumers removing {args.drain_rate:,} msg/s")
        print(
            "| mode | bound | wall s | largest queue depth | Redis used_memory_peak MiB | "
            "sampled peak MiB | deliveries |"
        )
        print("|---|---|---|---|---|---|---|")
        for mode in args.modes.split(","):
            limit = UNBOUNDED if mode == "unbounded" else bound
            conn = psycopg2.connect(pserver.url)
            with conn, conn.cursor() as cur:
                cur.execute("TRUNCATE core.fanout_progress, core.processed_jobs")
            conn.close()
            r = run_mode(pserver.url, args.tenants, limit, args.drain_rate)
            print(
                f"| {mode} | {limit:,} | {r['seconds']:.0f} | {r['largest_depth']:,} | "
                f"{r['peak_mib']:.1f} | {r['sampled_mib']:.1f} | {r['deliveries']:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
