"""TTL purge of core.processed_jobs: rows/s, and insert latency of a concurrent consumer.

Run: .venv/bin/python bench/dead_letters_purge.py [--rows 500000] [--batch-sizes 1000,5000,20000]

For each batch size the table is filled with ``--rows`` expired idempotency rows, then one
thread inserts fresh rows (one INSERT + COMMIT each, as a consumer does) while the
production ``purge_processed_jobs`` deletes the expired ones. Reported: purge throughput
and the concurrent inserts' latency (p50, p99, max) against the same inserter with no purge
running. For comparison the last row is one unbatched ``DELETE`` of all expired rows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2

from bench._servers import bench_postgres
from platform_tasks.postgres.maintenance import purge_processed_jobs
from platform_tasks.postgres.migrations import migrate
from platform_tasks.settings import PlatformSettings


class Inserter:
    """Inserts fresh idempotency rows in a loop and records each insert's latency."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = psycopg2.connect(self.url)
        try:
            with conn.cursor() as cur:
                while not self._stop.is_set():
                    started = time.perf_counter()
                    cur.execute(
                        "INSERT INTO core.processed_jobs (job_id, consumer) "
                        "VALUES (gen_random_uuid(), 'live')"
                    )
                    conn.commit()
                    self.latencies.append(time.perf_counter() - started)
        finally:
            conn.close()

    def __enter__(self) -> Inserter:
        self._thread.start()
        while len(self.latencies) < 50:
            time.sleep(0.01)  # bench warm-up only, not a test
        self.latencies.clear()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def fill(url: str, rows: int) -> None:
    conn = psycopg2.connect(url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("TRUNCATE core.processed_jobs")
            cur.execute(
                "INSERT INTO core.processed_jobs (job_id, consumer, processed_at) "
                "SELECT gen_random_uuid(), 'old', now() - interval '45 days' "
                "FROM generate_series(1, %s)",
                (rows,),
            )
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE core.processed_jobs")
    finally:
        conn.close()


def summary(latencies: list[float]) -> str:
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"{len(ms)} | {statistics.median(ms):.2f} | {p99:.2f} | {ms[-1]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--batch-sizes", default="1000,5000,20000")
    args = parser.parse_args()
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    with bench_postgres() as server:
        migrate(server.url)
        settings = PlatformSettings.build(database_url=server.url, processed_jobs_ttl_days=30)
        print(f"rows expired per run: {args.rows}")
        print("| purge | batches | seconds | rows/s | inserts during | p50 ms | p99 ms | max ms |")
        print("|---|---|---|---|---|---|---|---|")
        fill(server.url, args.rows)
        with Inserter(server.url) as idle:
            time.sleep(2.0)  # bench: a fixed window of inserts with no purge running
        print(f"| none (inserter alone, 2 s) | - | - | - | {summary(idle.latencies)} |")
        for size in sizes:
            fill(server.url, args.rows)
            with Inserter(server.url) as inserter:
                result = purge_processed_jobs(settings, batch_size=size)
            assert result.deleted == args.rows, result
            rate = result.deleted / result.seconds
            print(
                f"| batched, {size}/batch | {result.batches} | {result.seconds:.2f} | "
                f"{rate:,.0f} | {summary(inserter.latencies)} |"
            )
        fill(server.url, args.rows)
        cutoff = datetime.now(UTC) - timedelta(days=30)
        conn = psycopg2.connect(server.url)
        try:
            with Inserter(server.url) as inserter, conn, conn.cursor() as cur:
                started = time.perf_counter()
                cur.execute("DELETE FROM core.processed_jobs WHERE processed_at < %s", (cutoff,))
                deleted = cur.rowcount
                conn.commit()
                seconds = time.perf_counter() - started
        finally:
            conn.close()
        print(
            f"| one DELETE (comparison) | 1 | {seconds:.2f} | {deleted / seconds:,.0f} | "
            f"{summary(inserter.latencies)} |"
        )


if __name__ == "__main__":
    main()
