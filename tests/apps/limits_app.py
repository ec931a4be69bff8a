"""A PlatformTask app with per-key limits, for the limits end-to-end tests.

Every run writes a row of ``public.limit_runs`` in its own transaction: the tenant, the
delivery's attempt header, the worker, and PostgreSQL's ``clock_timestamp()`` when the
handler started and when it ended, so the tests can count overlapping runs of a tenant
from what really ran. ``hold_ms`` keeps a run going (its work takes that long) and
``block`` waits for ``test:release:<job id>`` in Redis (the kill test).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import redis
from celery import current_task
from pydantic import BaseModel

from platform_tasks import Envelope, PlatformTask, create_app
from platform_tasks.testing.servers import wait_until

QUEUE = "limits"
LEASE_TTL_SECONDS = 3
CAP = 2
THROTTLE = "5/s"
RARE = "1/h"

RUNS_TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS public.limit_runs ("
    " job_id uuid NOT NULL, task text NOT NULL, tenant text NOT NULL, attempt int NOT NULL,"
    " worker text NOT NULL, label text NOT NULL DEFAULT '',"
    " started_at timestamptz NOT NULL, ended_at timestamptz NOT NULL)"
)

app = create_app("limits_app", task_default_queue=QUEUE)
_redis = redis.Redis.from_url(os.environ.get("PLATFORM_REDIS_URL", "redis://127.0.0.1:6379/0"))


class Run(BaseModel):
    hold_ms: int = 0
    block: bool = False
    label: str = ""


def _tenant(envelope: Envelope[Any]) -> str | None:
    return envelope.tenant_id


@app.task(
    name="tests.limits.capped",
    base=PlatformTask,
    data_model=Run,
    concurrency_key=_tenant,
    max_concurrency=CAP,
    concurrency_lease_ttl=LEASE_TTL_SECONDS,
    concurrency_retry=0.2,
)
def capped(envelope: Envelope[Run], tx: Any) -> None:
    _run("capped", envelope, tx)


@app.task(
    name="tests.limits.throttled",
    base=PlatformTask,
    data_model=Run,
    throttle_key=_tenant,
    throttle=THROTTLE,
)
def throttled(envelope: Envelope[Run], tx: Any) -> None:
    _run("throttled", envelope, tx)


@app.task(
    name="tests.limits.rare",
    base=PlatformTask,
    data_model=Run,
    throttle_total=RARE,
)
def rare(envelope: Envelope[Run], tx: Any) -> None:
    """Throttled to one an hour: every job after the first waits in the delay store."""
    _run("rare", envelope, tx)


@app.task(name="tests.limits.plain", base=PlatformTask, data_model=Run)
def plain(envelope: Envelope[Run], tx: Any) -> None:
    _run("plain", envelope, tx)


def _attempt() -> int:
    request = current_task.request
    value = getattr(request, "platform_attempt", None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get("platform_attempt", 1)
    return int(value)


def _run(task: str, envelope: Envelope[Run], tx: Any) -> None:
    tx.execute("SELECT clock_timestamp()")
    (started,) = tx.fetchone()
    job = str(envelope.job_id)
    if envelope.data.block:
        _redis.rpush("test:started", f"{job}:{os.getpid()}")
        wait_until(lambda: _redis.exists(f"test:release:{job}"), timeout=120, interval=0.05)
    if envelope.data.hold_ms:
        time.sleep(envelope.data.hold_ms / 1000)  # the job's work takes this long
    tx.execute(
        "INSERT INTO public.limit_runs (job_id, task, tenant, attempt, worker, label, started_at,"
        " ended_at) VALUES (%s, %s, %s, %s, %s, %s, %s, clock_timestamp())",
        (
            job,
            task,
            envelope.tenant_id or "",
            _attempt(),
            f"{socket.gethostname()}:{current_task.request.hostname}",
            envelope.data.label,
            started,
        ),
    )
