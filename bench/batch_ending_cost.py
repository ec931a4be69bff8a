"""What counting a batch child's ending adds to its transaction, one session, no worker.

Run: .venv/bin/python bench/batch_ending_cost.py [--children 4000] [--rounds 2]

A batch of ``--children`` children is made; then, per round, a third of a round's
children each get a transaction with an ``INSERT`` (the handler's work) and ``COMMIT``
(the baseline), a third the same plus the ending counted on its own round trip before the
``COMMIT`` (``platform_tasks.batches.endings.count_ending`` with the batch id), and a
third the ending sent with the ``COMMIT`` (``count_applied_with_commit``, what the
consumer does; the last ending of a shard falls back to the ordinary count).
Milliseconds per transaction, measured in the same run; the last child's transaction
also publishes the callback.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2

from bench._servers import bench_postgres, bench_redis
from platform_tasks import QueuePort, create_app
from platform_tasks.batches import Callback
from platform_tasks.batches.children import RunningChild
from platform_tasks.batches.endings import count_applied, count_applied_with_commit, count_ending
from platform_tasks.postgres.migrations import migrate
from platform_tasks.settings import PlatformSettings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with bench_redis() as server, bench_postgres() as pg:
        migrate(pg.url)
        settings = PlatformSettings.build(
            redis_url=server.url, database_url=pg.url, profile="bench"
        )
        app = create_app("bench_batch_ending", settings=settings)
        port = QueuePort(app)
        conn = psycopg2.connect(pg.url)
        with conn, port.batch(on_complete=Callback("q", "bench.done", "t1", {}), tx=conn) as b:
            jobs = [
                b.publish("q", {"tenant_id": "t1", "kind": "bench.child", "data": {}})
                for _ in range(args.children)
            ]
        with conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE bench_effects (job_id uuid)")
        conn.autocommit = True  # as the consumer's connection: each BEGIN is sent by us
        cur = conn.cursor()
        per_round = args.children // args.rounds
        batch_id = b.id
        for r in range(args.rounds):
            chunk = jobs[r * per_round : (r + 1) * per_round]
            third = len(chunk) // 3
            base, counted, with_commit = (
                chunk[:third],
                chunk[third : 2 * third],
                chunk[2 * third : 3 * third],
            )
            start = time.perf_counter()
            for job in base:
                cur.execute("BEGIN; INSERT INTO bench_effects VALUES (%s)", (str(job),))
                cur.execute("COMMIT")
            plain = (time.perf_counter() - start) / len(base) * 1e3
            start = time.perf_counter()
            for job in counted:
                cur.execute("BEGIN; INSERT INTO bench_effects VALUES (%s)", (str(job),))
                count_ending(cur, job, "applied", lambda: port, batch_id)
                cur.execute("COMMIT")
            ending = (time.perf_counter() - start) / len(counted) * 1e3
            start = time.perf_counter()
            for job in with_commit:
                cur.execute("BEGIN; INSERT INTO bench_effects VALUES (%s)", (str(job),))
                if not count_applied_with_commit(cur, job, RunningChild(batch_id)):
                    count_applied(cur, job, RunningChild(batch_id), lambda: port)
                    cur.execute("COMMIT")
            sent = (time.perf_counter() - start) / len(with_commit) * 1e3
            print(
                f"[round {r + 1}] transaction {plain:.3f} ms; the ending on its own round "
                f"trip {ending:.3f} ms (+{ending - plain:.3f} ms); the ending with the "
                f"COMMIT {sent:.3f} ms (+{sent - plain:.3f} ms)"
            )
        port.close()
        conn.close()


if __name__ == "__main__":
    main()
