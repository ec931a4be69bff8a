"""Tasks for bench/consumer_throughput.py: a PlatformTask, the same insert done by hand, a no-op."""

from __future__ import annotations

import os
from typing import Any

import psycopg2

from platform_tasks import PlatformTask, create_app

app = create_app("bench_consumer")
_conn: Any = None
_pid: int | None = None


def _connection() -> Any:
    global _conn, _pid
    if _conn is None or _pid != os.getpid():
        _conn = psycopg2.connect(os.environ["PLATFORM_DATABASE_URL"])
        _pid = os.getpid()
    return _conn


@app.task(name="bench.platform", base=PlatformTask)
def platform_insert(envelope: Any, tx: Any) -> None:
    tx.execute("INSERT INTO public.bench_work (job_id) VALUES (%s) ON CONFLICT DO NOTHING",
               (str(envelope.job_id),))  # fmt: skip


@app.task(name="bench.plain")
def plain_insert(envelope: dict[str, Any]) -> None:
    conn = _connection()
    with conn.cursor() as cur:
        cur.execute("INSERT INTO public.bench_work (job_id) VALUES (%s) ON CONFLICT DO NOTHING",
                    (envelope["job_id"],))  # fmt: skip
    conn.commit()


@app.task(name="bench.noop")
def noop(envelope: dict[str, Any]) -> None:
    return None
