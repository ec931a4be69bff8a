"""Fan-out to many tenants against a loop of ``apply_async`` of the same envelopes.

Run: .venv/bin/python bench/fanout_throughput.py [--tenants 10000,100000] [--baseline 10000]

For each size, a fresh child process runs the fan-out consumer's code for one fan-out job
(tenants streamed from ``core.tenants`` on a real PostgreSQL, envelopes pushed to a real
Redis) and reports its wall time until every per-tenant message is on the queue, its RSS
before the fan-out and its peak RSS. Redis commands are counted by the server
(``INFO commandstats``) around each run: one ``LPUSH`` per batch, so commands per tenant
bound the round trips per tenant from above. The baseline, in the same run and the same
Redis, publishes the envelopes of the first ``--baseline`` tenants one by one with
``Task.apply_async`` (what a handler looping over tenants would do); the speed-up is the
ratio of messages per second.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2
import redis

from bench._servers import bench_postgres, bench_redis

JOB = "bench.fanout"
KIND = "bench.tenant_work"
QUEUE = "bench_work"
POINT = datetime(2025, 1, 1, 0, 0, tzinfo=UTC)


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def child(redis_url: str, database_url: str, batch: int) -> None:
    """One fan-out in this process; prints a JSON line with time and memory."""
    from platform_tasks import QueuePort
    from platform_tasks.envelope import parse_envelope
    from platform_tasks.fanout import FANOUT_KIND, FanOutRequest, fan_out_job_id, install
    from platform_tasks.fanout.consumer import run_fan_out
    from platform_tasks.settings import PlatformSettings
    from platform_tasks.testing import create_test_app

    # no consumer drains the queue here: the bound is lifted so the whole fan-out is timed
    # (bench/fanout_memory.py measures the bound)
    settings = PlatformSettings.build(
        redis_url=redis_url,
        database_url=database_url,
        profile="bench",
        fanout_batch_size=batch,
        fanout_max_queue_depth=10_000_000,
    )
    app = create_test_app("bench_fanout", settings=settings)
    install(app, QueuePort(app))
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
    before = _rss_kb()
    start = time.perf_counter()
    result = run_fan_out(app, envelope, settings=settings)  # type: ignore[arg-type]
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "seconds": seconds,
                "published": result.published_now,
                "rss_before_kb": before,
                "peak_rss_kb": peak,
            }
        )
    )


def baseline(redis_url: str, database_url: str, count: int) -> float:
    """Seconds for ``count`` envelopes published one by one with ``apply_async``."""
    from platform_tasks.envelope import parse_envelope
    from platform_tasks.fanout import fan_out_job_id, tenant_job_id
    from platform_tasks.fanout.publisher import send_task_options
    from platform_tasks.settings import PlatformSettings
    from platform_tasks.testing import create_test_app

    settings = PlatformSettings.build(
        redis_url=redis_url, database_url=database_url, profile="bench"
    )
    app = create_test_app("bench_baseline", settings=settings)

    @app.task(name=KIND, shared=False)  # type: ignore[untyped-decorator]
    def tenant_work(envelope: dict[str, object]) -> None:  # pragma: no cover - never run
        return None

    correlation = f"fanout-{fan_out_job_id(JOB, POINT, KIND)}"
    data = {"window_days": 7, "scheduled_for": "2025-01-01T00:00:00Z"}
    envelopes = [
        parse_envelope(
            {
                "job_id": str(tenant_job_id(JOB, POINT, KIND, f"t-{n:06d}")),
                "tenant_id": f"t-{n:06d}",
                "correlation_id": correlation,
                "kind": KIND,
                "data": data,
            }
        )
        for n in range(count)
    ]
    tenant_work.apply_async(**send_task_options("bench_warmup", envelopes[0]))  # connect first
    start = time.perf_counter()
    for envelope in envelopes:
        tenant_work.apply_async(**send_task_options("bench_baseline", envelope))
    return time.perf_counter() - start


def _commands(client: redis.Redis) -> dict[str, int]:
    return {name: int(stats["calls"]) for name, stats in client.info("commandstats").items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--tenants", default="10000,100000", help="comma-separated tenant counts, one fan-out each"
    )
    parser.add_argument(
        "--baseline", type=int, default=10_000, help="envelopes the apply_async loop publishes"
    )
    parser.add_argument("--batch", type=int, default=500, help="PLATFORM_FANOUT_BATCH_SIZE")
    parser.add_argument(
        "--child", nargs=2, metavar=("REDIS_URL", "DATABASE_URL"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        child(*args.child, batch=args.batch)
        return
    sizes = [int(part) for part in args.tenants.split(",")]
    from platform_tasks.postgres.migrations import migrate

    with bench_redis() as rserver, bench_postgres() as pserver:
        migrate(pserver.url)
        client = redis.Redis.from_url(rserver.url)
        rows = []
        for size in sizes:
            conn = psycopg2.connect(pserver.url)
            with conn, conn.cursor() as cur:
                cur.execute("TRUNCATE core.tenants, core.fanout_progress")
                cur.execute(
                    "INSERT INTO core.tenants (tenant_id, freshness_tier) "
                    "SELECT 't-' || lpad(n::text, 6, '0'), 'nightly' "
                    "FROM generate_series(0, %s - 1) AS n",
                    (size,),
                )
                cur.execute("ANALYZE core.tenants")
            conn.close()
            client.delete(QUEUE)
            before = _commands(client)
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--batch",
                    str(args.batch),
                    "--child",
                    rserver.url,
                    pserver.url,
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            after = _commands(client)
            report = json.loads(out.strip().splitlines()[-1])
            queued = client.llen(QUEUE)
            calls = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            calls.pop("cmdstat_info", None)
            total = sum(calls.values())
            rows.append((size, report, queued, total, calls.get("cmdstat_lpush", 0)))
            client.delete(QUEUE)
        base_count = min(args.baseline, max(sizes))
        base_seconds = baseline(rserver.url, pserver.url, base_count)
        base_rate = base_count / base_seconds
        print(
            f"baseline apply_async loop: {base_count} envelopes in {base_seconds:.2f} s "
            f"= {base_rate:,.0f} msg/s"
        )
        print(
            "| tenants | fan-out wall s | msg/s | vs apply_async | RSS before MiB | "
            "peak RSS MiB | Redis commands/tenant | LPUSH calls |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for size, report, queued, total, lpush in rows:
            assert queued == size == report["published"], (size, queued, report)
            rate = size / report["seconds"]
            print(
                f"| {size:,} | {report['seconds']:.2f} | {rate:,.0f} | {rate / base_rate:.1f}x | "
                f"{report['rss_before_kb'] / 1024:.1f} | {report['peak_rss_kb'] / 1024:.1f} | "
                f"{total / size:.4f} | {lpush} |"
            )


if __name__ == "__main__":
    main()
