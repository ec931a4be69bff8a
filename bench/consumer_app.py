"""Tasks for the consumer benchmarks: a PlatformTask, the same insert done by hand, the
platform's SQL done by hand (``bench/rabbitmq_throughput.py --sql-floor``), a no-op."""

from __future__ import annotations

import os
from typing import Any

import psycopg2

from platform_tasks import PlatformTask, create_app

app = create_app("bench_consumer")
_connections: dict[tuple[int, bool], Any] = {}


def _connection(*, autocommit: bool = False) -> Any:
    """This process's connection (one per mode; a forked pool process opens its own)."""
    key = (os.getpid(), autocommit)
    conn = _connections.get(key)
    if conn is None:
        conn = _connections[key] = psycopg2.connect(os.environ["PLATFORM_DATABASE_URL"])
        conn.autocommit = autocommit
    return conn


@app.task(name="bench.platform", base=PlatformTask)
def platform_insert(envelope: Any, tx: Any) -> None:
    tx.execute(
        "INSERT INTO public.bench_work (job_id) VALUES (%s) ON CONFLICT DO NOTHING",
        (str(envelope.job_id),),
    )


@app.task(name="bench.plain")
def plain_insert(envelope: dict[str, Any]) -> None:
    conn = _connection()
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO public.bench_work (job_id) VALUES (%s) ON CONFLICT DO NOTHING",
            (envelope["job_id"],),
        )
    conn.commit()


@app.task(name="bench.sql_floor")
def sql_floor(envelope: dict[str, Any]) -> None:
    """The round trips and rows of a PlatformTask's applied job, none of its Python: the
    claim (``BEGIN`` + ``core.claim_delivery``), the same insert, ``COMMIT``."""
    with _connection(autocommit=True).cursor() as cur:
        cur.execute(
            "BEGIN; SELECT claimed, marked FROM core.claim_delivery(%s, %s)",
            (envelope["job_id"], "bench.sql_floor"),
        )
        cur.fetchone()
        cur.execute(
            "INSERT INTO public.bench_work (job_id) VALUES (%s) ON CONFLICT DO NOTHING",
            (envelope["job_id"],),
        )
        cur.execute("COMMIT")


@app.task(name="bench.noop")
def noop(envelope: dict[str, Any]) -> None:
    return None
