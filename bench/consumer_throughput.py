"""Throughput of a PlatformTask against a plain Celery task doing the same INSERT, and a no-op.

Usage: .venv/bin/python bench/consumer_throughput.py [--jobs 2000] [--runs 5]
                                                      [--transport platform|stock]

One private Redis and PostgreSQL, one ``-P prefork -c 2`` worker per variant. The queue
is filled first, then the worker is started; the clock runs from the moment a tenth of
the jobs have been taken (steady state, past the pool's first-task imports and
connections) to the last job done. Commits per job come from
pg_stat_database.xact_commit deltas read from another database (so reading does not move
the counter). With ``--runs N`` the three variants run N times in turn on the same
servers (the insert variants in alternating order); each ratio is taken within one run,
and the median and range of the N ratios are printed.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg2
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from platform_tasks.envelope import uuid7  # noqa: E402
from platform_tasks.postgres.migrations import migrate  # noqa: E402
from platform_tasks.testing.servers import PostgresServer, RedisServer, wait_until  # noqa: E402


def commits(admin_url: str, dbname: str) -> int:
    conn = psycopg2.connect(admin_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (dbname,))
        value = int(cur.fetchone()[0])
    conn.close()
    return value


def run_variant(
    task: str,
    jobs: int,
    redis_url: str,
    db_url: str,
    admin_url: str,
    dbname: str,
    log: Path,
    run: int = 1,
) -> tuple[float, float]:
    os.environ["PLATFORM_REDIS_URL"] = redis_url
    os.environ["PLATFORM_DATABASE_URL"] = db_url
    from bench.consumer_app import app

    # a queue per run: a message a stopped worker left unacked comes back to its old queue
    queue = f"bench_{task.split('.')[1]}_{run}"
    r = redis.Redis.from_url(redis_url)
    with app.producer_or_acquire() as producer:
        for _ in range(jobs):
            env = {
                "job_id": str(uuid7()),
                "tenant_id": "bench",
                "correlation_id": "bench",
                "kind": task,
                "data": {},
            }
            app.send_task(task, args=[env], queue=queue, producer=producer)
    assert r.llen(queue) == jobs
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    before = commits(admin_url, dbname)
    argv = [
        str(Path(sys.executable).parent / "celery"),
        "-A",
        "bench.consumer_app",
        "worker",
        "-P",
        "prefork",
        "-c",
        "2",
        "-Q",
        queue,
        "--without-mingle",
        "--without-gossip",
        "--loglevel",
        "WARNING",
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        # steady state: the clock starts once a tenth of the jobs are taken, so the pool's
        # first-task work (imports, connections) is not billed to one variant's rate
        warm = jobs // 10
        wait_until(lambda: r.llen(queue) <= jobs - warm, timeout=60, interval=0.001)
        start = time.perf_counter()
        # poll Redis, not PostgreSQL: a polling query would count as a commit
        wait_until(lambda: r.llen(queue) == 0, timeout=300, interval=0.005)
        if task != "bench.noop":
            conn = psycopg2.connect(db_url)
            conn.autocommit = True

            def done() -> bool:
                with conn.cursor() as cur:
                    cur.execute("SELECT count(*) FROM public.bench_work")
                    return int(cur.fetchone()[0]) >= jobs

            wait_until(done, timeout=300, interval=0.05)
            conn.close()
        elapsed = time.perf_counter() - start
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            # a worker stuck in shutdown must not end the benchmark; its group is ours
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    # the worker's backends report their counters when they disconnect
    wait_until(lambda: commits(admin_url, dbname) == commits(admin_url, dbname), timeout=10)
    time.sleep(1.5)  # benchmark only: let the statistics collector catch up before reading
    per_job = (commits(admin_url, dbname) - before) / jobs
    conn = psycopg2.connect(db_url)
    with conn, conn.cursor() as cur:
        cur.execute("TRUNCATE public.bench_work, core.processed_jobs")
    conn.close()
    return (jobs - warm) / elapsed, per_job


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--transport", choices=("platform", "stock"), default="platform")
    args = parser.parse_args()
    os.environ["PLATFORM_TRANSPORT"] = args.transport
    base = Path(tempfile.mkdtemp(prefix="bench-consumer-"))
    os.chmod(base, 0o755)
    rs = RedisServer(base / "redis").start()
    pg = PostgresServer(base / "pg" / "data").start()
    try:
        migrate(pg.url)
        conn = psycopg2.connect(pg.url)
        with conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS public.bench_work (job_id uuid PRIMARY KEY)")
            cur.execute("SELECT current_database()")
            dbname = cur.fetchone()[0]
        conn.close()
        admin = pg.url.rsplit("/", 1)[0] + "/postgres"
        ratios: list[tuple[float, float]] = []
        for run in range(1, args.runs + 1):
            results = {}
            # alternate which of the two compared variants goes first, so drift in the
            # machine's load does not always favour the same one
            pair = ("bench.plain", "bench.platform")
            for task in ("bench.noop", *(pair if run % 2 else pair[::-1])):
                results[task] = run_variant(
                    task, args.jobs, rs.url, pg.url, admin, dbname, base / "worker.log", run
                )
                print(
                    f"run {run} {task}: {results[task][0]:.0f} jobs/s, "
                    f"{results[task][1]:.2f} commits/job",
                    flush=True,
                )
            platform, plain, noop = (
                results[t][0] for t in ("bench.platform", "bench.plain", "bench.noop")
            )
            ratios.append((platform / plain, platform / noop))
            print(f"run {run} platform / plain insert = {platform / plain:.2f} (target >= 0.85)")
            print(f"run {run} platform / no-op        = {platform / noop:.2f}", flush=True)
        if len(ratios) > 1:
            for label, values in (
                ("plain insert", [r[0] for r in ratios]),
                ("no-op", [r[1] for r in ratios]),
            ):
                print(
                    f"platform / {label}: median {statistics.median(values):.2f}, "
                    f"min {min(values):.2f}, max {max(values):.2f} over {len(values)} runs"
                )
    finally:
        pg.close()
        rs.stop()


if __name__ == "__main__":
    main()
