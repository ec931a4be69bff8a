"""Where a batch child's ending spends its time in PostgreSQL: its parts, one session.

Run: .venv/bin/python bench/batch_ending_parts.py [--children 36000] [--block 200]

One batch of ``--children`` children (32 shards, remaining counts high enough that no
shard reaches zero) is made with plain SQL; then blocks of ``--block`` transactions
alternate, in ABBA order, between these variants of one child's transaction, each an
``INSERT`` (the handler's work) and its ``COMMIT``:

- ``base``: nothing more;
- ``ending``: ``SAVEPOINT; EXECUTE`` the consumer's prepared ending; ``COMMIT`` (what a
  worker sends);
- ``ending, no savepoint``: the same without the ``SAVEPOINT``;
- ``ending, no lock step``: the ending without its ``SELECT ... FOR UPDATE`` of the child's
  row (not safe: a replay re-opening the row concurrently would be missed; measured only
  to price that step);
- ``child row only`` / ``shard row only``: one of the ending's two updates alone.

Prints the median of the blocks' median transaction time per variant and what it adds to
``base``, and how many of the updates of each table were HOT.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2

from bench._servers import bench_postgres
from platform_tasks.batches import store
from platform_tasks.postgres.migrations import migrate

SHARDS = 32

VARIANTS: dict[str, str] = {
    "base": "COMMIT",
    "ending": f"SAVEPOINT s; EXECUTE {store._PREPARED_NAME} (%s, 'applied', %s, true); COMMIT",
    "ending, no savepoint": f"EXECUTE {store._PREPARED_NAME} (%s, 'applied', %s, true); COMMIT",
    "ending, no lock step": "SAVEPOINT s; EXECUTE no_lock (%s, %s); COMMIT",
    "child row only": "SAVEPOINT s; EXECUTE child_row (%s, %s); COMMIT",
    "shard row only": "SAVEPOINT s; EXECUTE shard_row (%s, %s); COMMIT",
}

PREPARED = [
    """PREPARE no_lock (uuid, uuid) AS
    WITH ended AS (
        UPDATE core.batch_jobs bj SET outcome = 'applied', ended_at = clock_timestamp()
        WHERE bj.batch_id = $2 AND bj.job_id = $1 AND bj.outcome IS NULL
        RETURNING bj.batch_id, bj.job_id
    ), counted AS (
        UPDATE core.batch_shards s SET remaining = s.remaining - 1
        FROM ended, core.batches b
        WHERE b.batch_id = ended.batch_id AND s.batch_id = ended.batch_id
          AND s.shard = ((hashtext(ended.job_id::text) % b.shards) + b.shards) % b.shards
        RETURNING s.batch_id, s.remaining
    ) SELECT batch_id, remaining FROM counted""",
    """PREPARE child_row (uuid, uuid) AS
    UPDATE core.batch_jobs SET outcome = 'applied', ended_at = clock_timestamp()
    WHERE batch_id = $2 AND job_id = $1 AND outcome IS NULL""",
    f"""PREPARE shard_row (uuid, uuid) AS
    UPDATE core.batch_shards SET remaining = remaining - 1
    WHERE batch_id = $2 AND shard = ((hashtext($1::text) % {SHARDS}) + {SHARDS}) % {SHARDS}""",
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=36000)
    parser.add_argument("--block", type=int, default=200)
    args = parser.parse_args()
    with bench_postgres() as pg:
        migrate(pg.url)
        conn = psycopg2.connect(pg.url)
        conn.autocommit = True  # as the consumer's connection: each BEGIN is sent by us
        cur = conn.cursor()
        batch = str(uuid.uuid4())
        jobs = [str(uuid.uuid4()) for _ in range(args.children)]
        cur.execute("CREATE TABLE bench_effects (job_id uuid)")
        cur.execute("BEGIN")
        cur.execute(
            "INSERT INTO core.batches (batch_id, profile, shards) VALUES (%s, 'bench', %s)",
            (batch, SHARDS),
        )
        cur.execute(
            "INSERT INTO core.batch_jobs (batch_id, job_id, queue, kind, tenant_id) "
            "SELECT %s, u, 'q', 'bench.child', 't1' FROM unnest(%s::uuid[]) u",
            (batch, jobs),
        )
        cur.execute(
            "INSERT INTO core.batch_shards SELECT %s, s, %s FROM generate_series(0, %s) s",
            (batch, args.children, SHARDS - 1),
        )
        cur.execute("COMMIT")
        cur.execute("ANALYZE")
        cur.execute(store._prepared_end_job().replace("%%", "%"))
        for statement in PREPARED:
            cur.execute(statement)
        children = iter(jobs)
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        names = list(VARIANTS)
        for block in range(args.children // (len(names) * args.block)):
            for name in names if block % 2 == 0 else names[::-1]:
                block_times = []
                for _ in range(args.block):
                    job = next(children)
                    start = time.perf_counter()
                    cur.execute("BEGIN; INSERT INTO bench_effects VALUES (%s)", (job,))
                    if name == "base":
                        cur.execute(VARIANTS[name])
                    else:
                        cur.execute(VARIANTS[name], (job, batch))
                    block_times.append(time.perf_counter() - start)
                times[name].append(statistics.median(block_times) * 1e3)
        base = statistics.median(times["base"])
        for name, values in times.items():
            median = statistics.median(values)
            print(f"{name:24} {median:.3f} ms (+{median - base:.3f} ms), {len(values)} blocks")
        cur.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE relname IN ('batch_jobs', 'batch_shards') ORDER BY 1"
        )
        for table, updated, hot in cur.fetchall():
            print(f"{table}: {updated} updates, {hot} HOT")
        conn.close()


if __name__ == "__main__":
    main()
