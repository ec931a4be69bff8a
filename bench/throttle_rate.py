"""How close a per-key throttle runs to its limit across two real workers, never over it.

Usage: .venv/bin/python bench/throttle_rate.py [--jobs 100] [--throttle 5/s] [--runs 3]

One private Redis (broker, delay store and the throttle's buckets) and PostgreSQL, two
``celery worker -P prefork -c 2`` processes started as the README says. Each run publishes
``--jobs`` jobs of one tenant key at once (a backlog: the throttle refuses most of them,
they wait in the delay store with no attempt spent and come back at their slot), then
waits until every job has run. From the handlers' start times (PostgreSQL
``clock_timestamp()``):

- achieved rate: ``(jobs - 1) / (last start - first start)``, and its ratio to the limit
  (the baseline: what the throttle allows; 1.00 would use every token);
- the most starts within any 1000 ms, and the least time any ``limit + 1`` consecutive
  starts span (over 1 s: nothing ran over the limit by the handlers' clocks);
- jobs that ran, and any attempt other than 1 (a wait must spend none).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import psycopg2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from platform_tasks import QueuePort, create_app  # noqa: E402
from platform_tasks.postgres.migrations import migrate  # noqa: E402
from platform_tasks.settings import PlatformSettings  # noqa: E402
from platform_tasks.settings.rate_limits import RateLimit, parse_rate_limits  # noqa: E402
from platform_tasks.testing.servers import PostgresServer, RedisServer, wait_until  # noqa: E402

QUEUE = "bench_throttle"
TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS public.bench_throttle ("
    " job_id uuid PRIMARY KEY, tenant text NOT NULL, attempt int NOT NULL,"
    " worker text NOT NULL, started_at timestamptz NOT NULL)"
)


def rows(db_url: str, tenant: str) -> list[tuple[datetime, int, str]]:
    conn = psycopg2.connect(db_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "SELECT started_at, attempt, worker FROM public.bench_throttle"
                " WHERE tenant = %s ORDER BY started_at",
                (tenant,),
            )
            return list(cur.fetchall())
    finally:
        conn.close()


def start_worker(name: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    argv = [
        str(Path(sys.executable).parent / "celery"),
        "-A",
        "bench.throttle_app",
        "worker",
        "-P",
        "prefork",
        "-c",
        "2",
        "-n",
        f"{name}@%h",
        "--loglevel",
        "INFO",
        "--without-mingle",
        "--without-gossip",
    ]
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:  # a worker stuck in shutdown: its group is ours
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def measure(port: QueuePort, db_url: str, tenant: str, jobs: int, limit: RateLimit) -> dict:
    for _ in range(jobs):
        port.publish(QUEUE, {"tenant_id": tenant, "kind": "bench.throttled", "data": {}})
    timeout = jobs / limit.per_second * 3 + 60
    wait_until(
        lambda: len(rows(db_url, tenant)) >= jobs,
        timeout=timeout,
        interval=0.2,
        message=f"all {jobs} jobs of {tenant} ran",
    )
    ran = rows(db_url, tenant)
    starts = [row[0].timestamp() for row in ran]
    span = starts[-1] - starts[0]
    rate = (len(starts) - 1) / span
    n = int(limit.per_second)  # whole tokens per second: the most any 1000 ms may start
    in_window = max(sum(1 for t in starts[i:] if t < starts[i] + 1.0) for i in range(len(starts)))
    tightest = min(
        (starts[i + n] - starts[i] for i in range(len(starts) - n)), default=float("inf")
    )
    return {
        "ran": len(ran),
        "rate": rate,
        "ratio": rate / limit.per_second,
        "max_in_1s": in_window,
        "tightest": tightest,
        "bad_attempts": sum(1 for row in ran if row[1] != 1),
        "workers": len({row[2] for row in ran}),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--throttle", default="5/s")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    limit = parse_rate_limits(f"bench={args.throttle}")["bench"]
    base = Path(tempfile.mkdtemp(prefix="bench-throttle-"))
    os.chmod(base, 0o755)
    rs = RedisServer(base / "redis").start()
    pg = PostgresServer(base / "pg" / "data").start()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        migrate(pg.url)
        conn = psycopg2.connect(pg.url)
        with conn, conn.cursor() as cur:
            cur.execute(TABLE_SQL)
        conn.close()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PLATFORM_", "SENTRY_"))}
        env.update(
            PLATFORM_REDIS_URL=rs.url,
            PLATFORM_DATABASE_URL=pg.url,
            PLATFORM_PROFILE="bench",
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
            BENCH_THROTTLE=args.throttle,
        )
        workers = [start_worker(name, env, base / f"{name}.log") for name in ("w1", "w2")]
        settings = PlatformSettings.build(redis_url=rs.url, database_url=pg.url, profile="bench")
        app = create_app("bench_throttle_producer", settings=settings, task_default_queue=QUEUE)
        port = QueuePort(app)
        # both workers consuming before the clock matters: one warm-up job each way
        port.publish(QUEUE, {"tenant_id": "warm-up", "kind": "bench.throttled", "data": {}})
        wait_until(lambda: rows(pg.url, "warm-up"), timeout=120, message="a worker ran a job")
        results = []
        for run in range(1, args.runs + 1):
            result = measure(port, pg.url, f"key-{run}", args.jobs, limit)
            results.append(result)
            print(
                f"run {run}: {result['ran']} of {args.jobs} ran on {result['workers']} workers, "
                f"{result['rate']:.2f} jobs/s at {args.throttle} = {result['ratio']:.2f} "
                f"of the limit; most starts in any 1000 ms: {result['max_in_1s']}; "
                f"{int(limit.per_second) + 1} consecutive starts span at least "
                f"{result['tightest'] * 1000:.0f} ms; attempts other than 1: "
                f"{result['bad_attempts']}",
                flush=True,
            )
        ratios = [r["ratio"] for r in results]
        print(
            f"achieved / limit: median {statistics.median(ratios):.2f}, "
            f"min {min(ratios):.2f}, max {max(ratios):.2f} over {len(ratios)} runs; "
            f"most starts in any 1000 ms over all runs: {max(r['max_in_1s'] for r in results)}"
        )
        port.close()
        app.close()
    finally:
        for proc in workers:
            stop(proc)
        pg.close()
        rs.stop()
    print(f"worker logs: {base}")


if __name__ == "__main__":
    main()
