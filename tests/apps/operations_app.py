"""An app for the operations tests: each job writes one row in ``public.ops_applied``.

The row is written in the job's transaction with no unique key, so a job applied twice
shows as two rows. ``tests.ops.apply`` takes ``sleep`` seconds (work that keeps a queue
busy long enough to watch it drain); ``tests.ops.wait_cancel`` runs until
``is_cancelled()`` turns true (or 60 s pass) and records which it was in Redis.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from pydantic import BaseModel

from platform_tasks import Envelope, PlatformTask, create_app
from platform_tasks.operations import is_cancelled

app = create_app("operations_app")
_redis = redis.Redis.from_url(os.environ.get("PLATFORM_REDIS_URL", "redis://127.0.0.1:6379/0"))

TABLE = """
CREATE TABLE IF NOT EXISTS public.ops_applied (
    job_id     uuid NOT NULL,
    tenant_id  text NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


class Work(BaseModel):
    sleep: float = 0.0


@app.task(name="tests.ops.apply", base=PlatformTask, data_model=Work)
def apply(envelope: Envelope[Work], tx: Any) -> None:
    tx.execute("INSERT INTO public.ops_applied (job_id, tenant_id) VALUES (%s, %s)",
               (str(envelope.job_id), envelope.tenant_id))  # fmt: skip
    if envelope.data.sleep:
        time.sleep(envelope.data.sleep)  # the job's own work


@app.task(name="tests.ops.wait_cancel", base=PlatformTask, data_model=Work)
def wait_cancel(envelope: Envelope[Work], tx: Any) -> None:
    job = str(envelope.job_id)
    _redis.set(f"test:started:{job}", "1")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if is_cancelled():
            _redis.set(f"test:outcome:{job}", "cancelled")
            return
        time.sleep(0.05)  # a unit of the job's work between checks
    _redis.set(f"test:outcome:{job}", "ran out")
