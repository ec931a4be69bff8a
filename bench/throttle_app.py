"""The task of ``bench/throttle_rate.py``: a PlatformTask throttled per tenant key.

The throttle is read from ``BENCH_THROTTLE`` (default ``5/s``); each run writes the
handler's start (PostgreSQL ``clock_timestamp()``), its attempt header and its worker to
``public.bench_throttle``, in the job's own transaction.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from celery import current_task

from platform_tasks import Envelope, PlatformTask, create_app

QUEUE = "bench_throttle"
THROTTLE = os.environ.get("BENCH_THROTTLE", "5/s")

TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS public.bench_throttle ("
    " job_id uuid PRIMARY KEY, tenant text NOT NULL, attempt int NOT NULL,"
    " worker text NOT NULL, started_at timestamptz NOT NULL)"
)

app = create_app("bench_throttle", task_default_queue=QUEUE)


def _tenant(envelope: Envelope[Any]) -> str | None:
    return envelope.tenant_id


@app.task(name="bench.throttled", base=PlatformTask, throttle_key=_tenant, throttle=THROTTLE)
def throttled(envelope: Envelope[Any], tx: Any) -> None:
    request = current_task.request
    attempt = getattr(request, "platform_attempt", None) or 1
    tx.execute(
        "INSERT INTO public.bench_throttle (job_id, tenant, attempt, worker, started_at)"
        " VALUES (%s, %s, %s, %s, clock_timestamp())",
        (
            str(envelope.job_id),
            envelope.tenant_id or "",
            int(attempt),
            f"{socket.gethostname()}:{request.hostname}",
        ),
    )
