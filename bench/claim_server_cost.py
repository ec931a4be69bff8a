"""PostgreSQL's CPU per job: plain Celery's transaction, the PlatformTask's, and variants of
the idempotency claim, read from each backend process's own CPU time.

Usage: .venv/bin/python bench/claim_server_cost.py [--jobs 3000] [--rounds 9]

Why: on RabbitMQ the PlatformTask's PostgreSQL uses about 100-150 µs more CPU per job than
plain Celery's (``bench/rabbitmq_throughput.py``, split by process). This says how much of
it is the idempotency row itself and whether a cheaper shape of the claim exists. Every
variant sends the same transaction from one connection of its own (autocommit, the
``BEGIN`` travelling with the first statement as the platform sends it; plain Celery's
psycopg2 transaction for ``plain``): the claim (or nothing), the insert a handler makes,
``COMMIT``. Rounds of the variants are taken in turn; medians are printed.

Variants (the alternatives live in a schema of their own on the benchmark's server):

- ``plain``: ``BEGIN``, the insert, ``COMMIT`` (psycopg2's own transaction)
- ``platform``: ``core.claim_delivery`` (migration 0004), as the consumer calls it
- ``prepared``: the same call through ``PREPARE``/``EXECUTE``
- ``no look``: the function without its look for a delivery mark
- ``no time index``: the function on a copy of the table without ``processed_at``'s index
- ``brin time index``: the same with a BRIN index on ``processed_at`` instead
- ``bare insert``: the row inserted by a plain ``INSERT ... ON CONFLICT DO NOTHING``
- ``bare plain insert``: the same without ``ON CONFLICT`` (a duplicate would then be a
  unique violation that aborts the transaction): what the conflict check itself costs
- ``fn plain insert``: the function with that plain ``INSERT``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from platform_tasks.envelope import uuid7  # noqa: E402
from platform_tasks.postgres.migrations import migrate  # noqa: E402
from platform_tasks.testing.servers import PostgresServer  # noqa: E402

INSERT = "INSERT INTO public.bench_work (job_id) VALUES (%s) ON CONFLICT DO NOTHING"
LOOK = """marked := current_setting('transaction_isolation') <> 'read committed'
        OR EXISTS (SELECT 1 FROM core.delivery_marks
                   WHERE job_id = p_job_id AND consumer = p_consumer)
        OR EXISTS (SELECT 1 FROM core.dead_letters WHERE job_id = p_job_id);"""

PREPARE = "PREPARE claim(uuid, text) AS SELECT claimed, marked FROM core.claim_delivery($1, $2)"

CLAIMS = {
    "plain": None,
    "platform": "SELECT claimed, marked FROM core.claim_delivery(%s, %s)",
    "prepared": "EXECUTE claim(%s, %s)",
    "no look": "SELECT claimed, marked FROM alt.claim_no_look(%s, %s)",
    "no time index": "SELECT claimed, marked FROM alt.claim_no_time_index(%s, %s)",
    "brin time index": "SELECT claimed, marked FROM alt.claim_brin_time_index(%s, %s)",
    "bare insert": "INSERT INTO core.processed_jobs (job_id, consumer) VALUES (%s, %s) "
    "ON CONFLICT (job_id, consumer) DO NOTHING RETURNING 1",
    "bare plain insert": "INSERT INTO core.processed_jobs (job_id, consumer) VALUES (%s, %s) "
    "RETURNING 1",
    "fn plain insert": "SELECT claimed, marked FROM alt.claim_plain_insert(%s, %s)",
}


def claim_function(name: str, table: str, look: str, *, on_conflict: bool = True) -> str:
    conflict = "ON CONFLICT (job_id, consumer) DO NOTHING" if on_conflict else ""
    return f"""CREATE FUNCTION alt.{name}(p_job_id uuid, p_consumer text,
        OUT claimed boolean, OUT marked boolean) LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
        INSERT INTO {table} (job_id, consumer) VALUES (p_job_id, p_consumer)
        {conflict};
        claimed := FOUND;
        {look}
    END $$"""


def create_variants(url: str) -> None:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE public.bench_work (job_id uuid PRIMARY KEY)")
        cur.execute("CREATE SCHEMA alt")
        for table, index in (("no_time_index", ""), ("brin_time_index", "brin")):
            cur.execute(f"CREATE TABLE alt.{table} (LIKE core.processed_jobs INCLUDING DEFAULTS)")
            cur.execute(f"ALTER TABLE alt.{table} ADD PRIMARY KEY (job_id, consumer)")
            if index:
                cur.execute(f"CREATE INDEX ON alt.{table} USING {index} (processed_at)")
            cur.execute(claim_function(f"claim_{table}", f"alt.{table}", LOOK))
        cur.execute(claim_function("claim_no_look", "core.processed_jobs", "marked := false;"))
        cur.execute(
            claim_function("claim_plain_insert", "core.processed_jobs", LOOK, on_conflict=False)
        )
    conn.close()


def backend_cpu(pid: int) -> float:
    """User + system CPU seconds of one PostgreSQL backend so far."""
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    fields = text[text.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def job_of(variant: str, conn: Any) -> Callable[[str], None]:
    """One job's transaction as the variant sends it."""
    claim = CLAIMS[variant]
    if claim is None:

        def plain(job: str) -> None:
            with conn.cursor() as cur:
                cur.execute(INSERT, (job,))
            conn.commit()

        return plain
    claim_sql = "BEGIN; " + claim

    def platform(job: str) -> None:
        with conn.cursor() as cur:
            cur.execute(claim_sql, (job, "bench.platform"))
            cur.fetchone()
            cur.execute(INSERT, (job,))
            cur.execute("COMMIT")

    return platform


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-claim-cost-"))
    os.chmod(base, 0o755)
    pg = PostgresServer(base / "pg" / "data").start()
    try:
        migrate(pg.url)
        create_variants(pg.url)
        jobs: dict[str, tuple[Callable[[str], None], int]] = {}
        for variant in CLAIMS:
            conn = psycopg2.connect(pg.url)
            conn.autocommit = CLAIMS[variant] is not None
            with conn.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                pid = int(cur.fetchone()[0])
                if variant == "prepared":
                    cur.execute(PREPARE)
            jobs[variant] = job_of(variant, conn), pid
        cpu: dict[str, list[float]] = {variant: [] for variant in CLAIMS}
        for _ in range(args.rounds):
            for variant, (job, pid) in jobs.items():
                ids = [str(uuid7()) for _ in range(args.jobs)]
                before = backend_cpu(pid)
                for job_id in ids:
                    job(job_id)
                cpu[variant].append((backend_cpu(pid) - before) / args.jobs)
        plain = statistics.median(cpu["plain"])
        for variant, values in cpu.items():
            median = statistics.median(values)
            print(
                f"{variant:16s} PostgreSQL CPU per job: median {median * 1e6:4.0f} us "
                f"({(median - plain) * 1e6:+4.0f} over plain; rounds "
                f"{min(values) * 1e6:.0f}-{max(values) * 1e6:.0f})"
            )
    finally:
        pg.close()


if __name__ == "__main__":
    main()
