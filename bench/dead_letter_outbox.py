"""What dead-letter incidents cost: the dead-letter write with its outbox entry, and a pass.

Run: .venv/bin/python bench/dead_letter_outbox.py [--rows 5000] [--rounds 5] [--storm 20000]

1. Write rate of dead letters, one ``INSERT`` + ``COMMIT`` per row as a consumer writes
   them: the shipped ``insert_dead_letter`` (which also queues the row in
   ``core.alert_outbox``, and maintains the index of pending rows by group) against the
   write before migration 0008 (the same code with the statement it ran then, and that
   index dropped), alternated in ``--rounds`` rounds on one connection so both see the
   same machine load. Reported as rows/s and the ratio.
2. The alert sender counting a storm of ``--storm`` dead letters of one group into its
   incident (``count_new_dead_letters``): rows/s; and an idle pass (nothing new, one open
   group with pending rows, nothing due) in ms, the cost every worker pays each
   ``PLATFORM_ALERT_SEND_INTERVAL_SECONDS``.

Real PostgreSQL started by the script; no HTTP (the sink's calls are per incident, not per
dead letter).
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
from platform_tasks.dead_letters import dead_letter, incidents
from platform_tasks.dead_letters.dead_letter import insert_dead_letter
from platform_tasks.postgres.migrations import migrate

WITHOUT_OUTBOX = """
INSERT INTO core.dead_letters
    (job_id, queue, kind, tenant_id, payload, attempts, last_error, error_type, reason,
     correlation_id, headers)
VALUES
    (%(job_id)s, %(queue)s, %(kind)s, %(tenant_id)s, %(payload)s, %(attempts)s,
     %(last_error)s, %(error_type)s, %(reason)s, %(correlation_id)s, %(headers)s)
RETURNING id
"""


GROUP_INDEX = """
CREATE INDEX dead_letters_pending_group_idx
    ON core.dead_letters (coalesce(queue, ''), coalesce(kind, ''), coalesce(error_type, reason))
    WHERE status = 'pending_review'
"""


def _values(n: int) -> dict[str, object]:
    job_id = uuid.uuid4()
    return {
        "job_id": job_id,
        "queue": "billing",
        "kind": "bench.charge",
        "tenant_id": f"tenant-{n % 50}",
        "payload": {"job_id": str(job_id), "kind": "bench.charge", "data": {"n": n}},
        "attempts": 3,
        "last_error": "RuntimeError: boom\nTraceback ...",
        "error_type": "RuntimeError",
        "reason": "retries_exhausted",
        "correlation_id": uuid.uuid4().hex,
    }


def write_with_outbox(conn: psycopg2.extensions.connection, rows: int) -> float:
    started = time.perf_counter()
    for n in range(rows):
        with conn, conn.cursor() as cur:
            insert_dead_letter(cur, **_values(n))  # type: ignore[arg-type]
    return rows / (time.perf_counter() - started)


def write_without_outbox(conn: psycopg2.extensions.connection, rows: int) -> float:
    """The same ``insert_dead_letter`` code with the statement it ran before 0008."""
    shipped = dead_letter._queries
    queries = {**shipped(), "insert_dead_letter": WITHOUT_OUTBOX}
    dead_letter._queries = lambda: queries  # type: ignore[assignment]
    try:
        return write_with_outbox(conn, rows)
    finally:
        dead_letter._queries = shipped  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--storm", type=int, default=20000)
    args = parser.parse_args()
    import logging

    logging.disable(logging.INFO)  # insert_dead_letter logs each row
    with bench_postgres() as server:
        migrate(server.url)
        conn = psycopg2.connect(server.url)
        with_rates: list[float] = []
        without_rates: list[float] = []
        for _ in range(args.rounds):
            with conn, conn.cursor() as cur:  # the table as it was before 0008
                cur.execute("DROP INDEX core.dead_letters_pending_group_idx")
            without_rates.append(write_without_outbox(conn, args.rows))
            with conn, conn.cursor() as cur:
                cur.execute(GROUP_INDEX)
            with_rates.append(write_with_outbox(conn, args.rows))
        with conn, conn.cursor() as cur:
            cur.execute("TRUNCATE core.dead_letters, core.alert_outbox, core.alert_incidents")
        for n in range(args.storm):
            with conn, conn.cursor() as cur:
                insert_dead_letter(cur, **_values(n))  # type: ignore[arg-type]
        started = time.perf_counter()
        counted = incidents.count_new_dead_letters(conn, "betterstack")
        count_rate = counted / (time.perf_counter() - started)
        idle: list[float] = []
        for _ in range(50):
            started = time.perf_counter()
            incidents.count_new_dead_letters(conn, "betterstack")
            incidents.resolve_fixed_groups(conn, "betterstack")
            incidents.claim_due(conn, "betterstack", lease_seconds=30)
            idle.append((time.perf_counter() - started) * 1000)
        conn.close()
    base = statistics.median(without_rates)
    shipped = statistics.median(with_rates)
    print(f"dead-letter writes ({args.rows} rows x {args.rounds} rounds, median rows/s)")
    print("| write | rows/s | x without outbox |")
    print("|---|---:|---:|")
    print(f"| without outbox (before 0008, baseline) | {base:,.0f} | 1.00 |")
    print(f"| with outbox (shipped) | {shipped:,.0f} | {shipped / base:.2f} |")
    print()
    print(f"sender: counted a storm of {counted:,} dead letters at {count_rate:,.0f} rows/s")
    print(
        f"sender: idle pass (one open group with {args.storm:,} pending, nothing due): "
        f"median {statistics.median(idle):.2f} ms, max {max(idle):.2f} ms"
    )


if __name__ == "__main__":
    main()
