"""Throughput of a PlatformTask with job status support on (the default) and off.

Usage: .venv/bin/python bench/job_status_throughput.py [--jobs 3000] [--runs 4]

What "on" costs per job: its entry among the running jobs of the worker process (a
marker is written only for a job running past half a second: none here) and the
correlation id written by the claim into ``core.processed_jobs`` with its partial index
(no extra statement). ``PLATFORM_JOB_STATUS=false`` turns both off. The handler is
``bench.platform`` (one INSERT, returns None: no recorded output). One private Redis and
PostgreSQL, one ``-P prefork -c 2`` worker per variant, the queue filled first (each job
its own correlation id); the two variants alternate which goes first in each run, and
the ratio on/off is taken within a run. Built on ``bench/consumer_throughput.py`` (same
clock: from a tenth of the jobs taken to the last one committed).

Wall-clock rates on a shared two-core machine swing with other load, so the worker's CPU
time per job is printed too (user + system of the worker and its pool processes, from
``RUSAGE_CHILDREN`` around each variant: start-up included, the same for both) and its
ratio off / on, the steadier measure.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg2
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.consumer_throughput import commits  # noqa: E402
from platform_tasks.envelope import uuid7  # noqa: E402
from platform_tasks.postgres.migrations import migrate  # noqa: E402
from platform_tasks.testing.servers import PostgresServer, RedisServer, wait_until  # noqa: E402


def run_variant(
    label: str,
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
    queue = f"bench_status_{label}_{run}"
    r = redis.Redis.from_url(redis_url)
    with app.producer_or_acquire() as producer:
        for _ in range(jobs):
            env = {
                "job_id": str(uuid7()),
                "tenant_id": "bench",
                "correlation_id": uuid.uuid4().hex,
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


def _bookkeeping_us(status_on: bool, count: int = 20_000) -> float:
    """Microseconds of the worker's own bookkeeping per job (begin, reporting, finish) with
    status on or off: what "on" adds to a short job's Python, without any server."""
    from platform_tasks.jobs_status.running import JobMarker, RunningMarkers

    markers = RunningMarkers(lambda: None, "bench", watch=False) if status_on else None
    job = str(uuid7())

    def one() -> None:
        marker = JobMarker(markers, job)
        marker.start(consumer="bench.platform", queue="q", attempt=1, ttl_seconds=300)
        with marker.reporting():
            pass
        marker.end()

    start = time.perf_counter()
    for _ in range(count):
        one()
    return (time.perf_counter() - start) / count * 1e6


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    on_us, off_us = _bookkeeping_us(True), _bookkeeping_us(False)
    print(f"bookkeeping per job: on {on_us:.1f} us, off {off_us:.1f} us", flush=True)
    base = Path(tempfile.mkdtemp(prefix="bench-status-throughput-"))
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
        ratios: list[float] = []
        cpu_ratios: list[float] = []
        for run in range(1, args.runs + 1):
            rates: dict[str, float] = {}
            cpu: dict[str, float] = {}
            order = ("on", "off") if run % 2 else ("off", "on")
            for label in order:
                os.environ["PLATFORM_JOB_STATUS"] = "true" if label == "on" else "false"
                cpu_before = _children_cpu()
                rate, per_job = run_variant(
                    label,
                    "bench.platform",
                    args.jobs,
                    rs.url,
                    pg.url,
                    admin,
                    dbname,
                    base / "worker.log",
                    run,
                )
                rates[label] = rate
                cpu[label] = (_children_cpu() - cpu_before) / args.jobs * 1000
                print(
                    f"run {run} status {label}: {rate:.0f} jobs/s, {per_job:.2f} commits/job, "
                    f"{cpu[label]:.3f} ms CPU/job",
                    flush=True,
                )
            ratios.append(rates["on"] / rates["off"])
            cpu_ratios.append(cpu["off"] / cpu["on"])
            print(
                f"run {run} on / off = {ratios[-1]:.3f} (goal >= 0.97); "
                f"CPU/job off / on = {cpu_ratios[-1]:.3f}",
                flush=True,
            )
        for label, values in (("jobs/s on / off", ratios), ("CPU/job off / on", cpu_ratios)):
            print(
                f"{label}: median {statistics.median(values):.3f}, min {min(values):.3f}, "
                f"max {max(values):.3f} over {len(values)} runs"
            )
    finally:
        pg.close()
        rs.stop()


if __name__ == "__main__":
    main()
