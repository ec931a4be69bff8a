"""Bulk replay by filter vs the CLI's one-at-a-time replay: rows/s and peak memory.

Run: .venv/bin/python bench/bulk_replay.py [--rows 10000,50000] [--one-at-a-time 40]

Real PostgreSQL and Redis (the broker) are started for the run. For the baseline,
``platform-tasks dead-letters replay ID`` is run once per row (``--one-at-a-time`` rows):
what an operator does today, one command per dead letter. For comparison the same
one-row replay is also timed in-process (``replay_dead_letters(ids=[id])``, no process
start). Then ``platform-tasks dead-letters replay --kind K --yes`` replays each size in
``--rows`` as one operation (500 rows per transaction); its peak RSS is measured by a
parent that runs only it (``ru_maxrss`` of the child), so memory can be compared across
sizes. Every replay publishes to the Redis broker's list, which is emptied between runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2
import redis
from psycopg2.extras import Json, execute_values

from bench._servers import bench_postgres, bench_redis
from platform_tasks.dead_letters import replay_dead_letters
from platform_tasks.envelope import uuid7
from platform_tasks.migrations import migrate
from platform_tasks.queue_port import platform_queue_port
from platform_tasks.settings import PlatformSettings

ROOT = Path(__file__).resolve().parent.parent
CLI = str(Path(sys.executable).parent / "platform-tasks")


def add_rows(url: str, count: int, kind: str) -> list[int]:
    rows = []
    for _ in range(count):
        job = str(uuid7())
        payload = {"job_id": job, "tenant_id": "t1", "correlation_id": uuid.uuid4().hex,
                   "kind": kind, "data": {"n": 1, "text": "x" * 200}}  # fmt: skip
        rows.append((job, "bench", kind, "t1", Json(payload), 5, "boom", "RuntimeError",
                     "retries_exhausted", payload["correlation_id"]))  # fmt: skip
    conn = psycopg2.connect(url)
    try:
        with conn, conn.cursor() as cur:
            ids = execute_values(
                cur,
                "INSERT INTO core.dead_letters (job_id, queue, kind, tenant_id, payload, "
                "attempts, last_error, error_type, reason, correlation_id) VALUES %s "
                "RETURNING id",
                rows, page_size=1000, fetch=True,
            )  # fmt: skip
        return [int(row[0]) for row in ids]
    finally:
        conn.close()


def run_measured(args: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Wall time (s) and peak RSS (KiB) of one CLI run."""
    started = time.perf_counter()
    proc = subprocess.Popen([CLI, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)  # fmt: skip
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{args} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return elapsed, int(usage.ru_maxrss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="10000,50000")
    parser.add_argument("--one-at-a-time", type=int, default=40)
    options = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sizes = [int(n) for n in options.rows.split(",")]
    with bench_redis() as redis_server, bench_postgres() as pg:
        migrate(pg.url)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLATFORM_")}
        env.update({"PLATFORM_REDIS_URL": redis_server.url, "PLATFORM_DATABASE_URL": pg.url,
                    "PLATFORM_PROFILE": "bench", "PLATFORM_ACTOR": "bench"})  # fmt: skip
        client = redis.Redis.from_url(redis_server.url)

        ids = add_rows(pg.url, options.one_at_a_time, "bench.one")
        started = time.perf_counter()
        for row_id in ids:
            run_measured(["dead-letters", "replay", str(row_id)], env)
        cli_rate = len(ids) / (time.perf_counter() - started)
        client.delete("bench")

        settings = PlatformSettings.build(redis_url=redis_server.url, database_url=pg.url,
                                          profile="bench")  # fmt: skip
        ids = add_rows(pg.url, max(options.one_at_a_time, 200), "bench.lib")
        port = platform_queue_port(settings)
        conn = psycopg2.connect(pg.url)
        try:
            started = time.perf_counter()
            for row_id in ids:
                replay_dead_letters(conn, port.publish, ids=[row_id])
            lib_rate = len(ids) / (time.perf_counter() - started)
        finally:
            conn.close()
            port.close()
        client.delete("bench")

        once = options.one_at_a_time
        print(f"one at a time, CLI process per row: {cli_rate:,.1f} rows/s ({once} rows)")
        print(f"one at a time, in-process:          {lib_rate:,.1f} rows/s ({len(ids)} rows)")
        print(
            "| rows | bulk rows/s | x CLI one-at-a-time | x in-process one-at-a-time | peak RSS |"
        )
        print("|---:|---:|---:|---:|---:|")
        for size in sizes:
            kind = f"bench.bulk{size}"
            add_rows(pg.url, size, kind)
            elapsed, peak = run_measured(["dead-letters", "replay", "--kind", kind, "--yes"], env)
            assert client.llen("bench") == size, client.llen("bench")
            client.delete("bench")
            rate = size / elapsed
            print(f"| {size:,} | {rate:,.0f} | {rate / cli_rate:,.0f}x | {rate / lib_rate:,.1f}x "
                  f"| {peak / 1024:,.0f} MiB |")  # fmt: skip
        client.close()


if __name__ == "__main__":
    main()
