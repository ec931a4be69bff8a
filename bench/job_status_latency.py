"""Latency of ``jobs show`` (:class:`platform_tasks.jobs_status.StatusReader`) on big stores.

Usage: .venv/bin/python bench/job_status_latency.py [--rows 1000000] [--waiting 100000]
                                                    [--lookups 300] [--queues 4]

One private Redis and PostgreSQL. ``core.processed_jobs`` gets ``--rows`` applied jobs
(one consumer each, a correlation id per 10 jobs, an output on every 10th); the broker
gets ``--waiting`` waiting messages spread over ``--queues`` queues (real wire messages:
one published through the queue port, copied with fresh job ids), and the delay store
1,000 scheduled entries. Then ``--lookups`` random jobs of each kind are answered on one
reader (connections kept, as the console does; the CLI adds its process start):

- applied: a random row of the million (answered by PostgreSQL alone);
- waiting: a random waiting message (PostgreSQL finds nothing, then the marker, then the
  server-side search of every list, lane, the unacked hash and the delay store);
- unknown: an id no store has (the whole search, nothing found: the worst case), a UUIDv4
  (no time to bisect on) and a UUIDv7 of now (bisected first, then the whole search);
- correlation: the 10 applied jobs of one correlation id, and apart its three PostgreSQL
  reads alone (claims, dead letters, outbox), whose plan on the million rows is printed
  (``EXPLAIN ANALYZE``) to show the index it uses.

The baseline, measured in the same run on the same connection: one primary-key
``SELECT`` on ``core.processed_jobs``. Printed: p50, p99 and max per kind, in ms.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from platform_tasks.app import platform_queue_port  # noqa: E402
from platform_tasks.envelope import uuid7  # noqa: E402
from platform_tasks.jobs_status import StatusReader  # noqa: E402
from platform_tasks.jobs_status.lookup import CORRELATION_LIMIT  # noqa: E402
from platform_tasks.jobs_status.outbox_rows import spellings  # noqa: E402
from platform_tasks.postgres.migrations import migrate  # noqa: E402
from platform_tasks.postgres.queries import load_queries  # noqa: E402
from platform_tasks.settings import PlatformSettings  # noqa: E402
from platform_tasks.testing.servers import PostgresServer, RedisServer  # noqa: E402

STATUS_QUERIES = load_queries("job_status")

FILL_SQL = """
INSERT INTO core.processed_jobs (job_id, consumer, processed_at, correlation_id, output)
SELECT gen_random_uuid(), 'bench.consumer', now() - (n || ' seconds')::interval,
       'corr-' || (n / 10), CASE WHEN n %% 10 = 0 THEN '{"rows": 3}'::jsonb END
FROM generate_series(%(start)s, %(stop)s) AS n
"""


def fill_postgres(url: str, rows: int) -> list[str]:
    conn = psycopg2.connect(url)
    with conn, conn.cursor() as cur:
        for start in range(0, rows, 200_000):
            cur.execute(FILL_SQL, {"start": start, "stop": min(rows, start + 200_000) - 1})
        cur.execute("ANALYZE core.processed_jobs")
        cur.execute("SELECT job_id FROM core.processed_jobs TABLESAMPLE SYSTEM (1) LIMIT 5000")
        sample = [str(row[0]) for row in cur.fetchall()]
    conn.close()
    return sample


def fill_redis(settings: PlatformSettings, waiting: int, queues: list[str]) -> list[str]:
    port = platform_queue_port(settings)
    client = redis.Redis.from_url(settings.redis_url)
    templates: dict[str, tuple[str, str]] = {}
    for queue in queues:
        payload = {"tenant_id": "acme", "kind": "bench.work", "data": {"n": 1}}
        job = str(port.publish(queue, payload))
        templates[queue] = (job, client.lpop(queue).decode())
    later = datetime.now(UTC) + timedelta(hours=1)
    for _ in range(1000):
        port.schedule(queues[0], {"tenant_id": "acme", "kind": "bench.work", "data": {}}, later)
    port.close()
    ids: list[str] = []
    pipe = client.pipeline(transaction=False)
    for index in range(waiting):
        queue = queues[index % len(queues)]
        template_id, wire = templates[queue]
        job = str(uuid7())
        pipe.lpush(queue, wire.replace(template_id, job))
        ids.append(job)
        if index % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    client.close()
    return ids


def timed(call: Callable[[], object], count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return times


def report(label: str, times: list[float]) -> None:
    times = sorted(times)
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    print(
        f"{label:<34} p50 {statistics.median(times):7.2f} ms   p99 {p99:7.2f} ms   "
        f"max {times[-1]:7.2f} ms",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--waiting", type=int, default=100_000)
    parser.add_argument("--lookups", type=int, default=300)
    parser.add_argument("--queues", type=int, default=4)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-status-"))
    rs = RedisServer(base / "redis").start()
    pg = PostgresServer(base / "pg" / "data").start()
    try:
        migrate(pg.url)
        settings = PlatformSettings.build(redis_url=rs.url, database_url=pg.url, profile="bench")
        queues = [f"queue{i}" for i in range(args.queues)]
        started = time.perf_counter()
        applied = fill_postgres(pg.url, args.rows)
        waiting = fill_redis(settings, args.waiting, queues)
        print(
            f"filled {args.rows:,} rows and {args.waiting:,} waiting messages over "
            f"{args.queues} queues in {time.perf_counter() - started:.0f} s",
            flush=True,
        )
        rng = random.Random(7)

        def correlation_params() -> dict[str, object]:
            correlation_id = f"corr-{rng.randrange(args.rows // 10)}"
            return {**spellings(correlation_id), "limit": CORRELATION_LIMIT}

        with StatusReader(settings, queues=queues) as reader:
            assert reader.job(rng.choice(applied)).state == "applied"
            assert reader.job(rng.choice(waiting)).state == "waiting"
            cur = reader._cursor()  # the reader's own connection, for the baseline
            pk = "SELECT 1 FROM core.processed_jobs WHERE job_id = %s AND consumer = %s"
            for label, call in (
                (
                    "baseline: one primary-key SELECT",
                    lambda: cur.execute(pk, (rng.choice(applied), "bench.consumer")),
                ),
                ("jobs show: applied (1M rows)", lambda: reader.job(rng.choice(applied))),
                ("jobs show: waiting (search)", lambda: reader.job(rng.choice(waiting))),
                ("jobs show: unknown (full search)", lambda: reader.job(str(uuid.uuid4()))),
                ("jobs show: unknown UUIDv7", lambda: reader.job(str(uuid7()))),
                (
                    "jobs list --correlation-id (10)",
                    lambda: reader.correlation(f"corr-{rng.randrange(args.rows // 10)}"),
                ),
                (
                    "  its PostgreSQL reads alone",
                    lambda: reader._rows(cur, "by_correlation", correlation_params(), {}),
                ),
            ):
                call()  # warm: plans, scripts loaded
                report(label, timed(call, args.lookups))
            cur.execute(
                "EXPLAIN (ANALYZE, BUFFERS) " + STATUS_QUERIES["processed_by_correlation"],
                {**correlation_params(), "profile": "bench"},
            )
            print("\n".join(str(row["QUERY PLAN"]) for row in cur.fetchall()))
        print(json.dumps({"rows": args.rows, "waiting": args.waiting, "queues": args.queues}))
    finally:
        pg.close()
        rs.stop()


if __name__ == "__main__":
    main()
