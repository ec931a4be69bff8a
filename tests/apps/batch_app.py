"""A PlatformTask app for the batch tests.

``tests.batch.child`` writes one row into ``public.batch_effects`` (no unique key: a
child applied twice shows as two rows) in its transaction. Its data chooses the rest:
``fail`` raises an error listed in ``permanent_errors`` (dead-lettered at once) unless
``public.batch_fixed`` holds the job id (a fix before the replay); ``add`` adds that many
children to its own batch (``batch_of``). ``tests.batch.callback`` records each callback
it runs in ``public.batch_callbacks`` (again no unique key: a second run shows).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from platform_tasks import Envelope, PlatformTask, QueuePort, RetryPolicy, create_app
from platform_tasks.batches import batch_of

QUEUE = "batches"
CHILD = "tests.batch.child"
CALLBACK = "tests.batch.callback"

TABLES_SQL = (
    "CREATE TABLE IF NOT EXISTS public.batch_effects ("
    " job_id uuid NOT NULL, pid integer NOT NULL,"
    " applied_at timestamptz NOT NULL DEFAULT clock_timestamp());"
    "CREATE TABLE IF NOT EXISTS public.batch_fixed (job_id uuid PRIMARY KEY);"
    "CREATE TABLE IF NOT EXISTS public.batch_callbacks ("
    " job_id uuid NOT NULL, batch_id uuid NOT NULL, name text NOT NULL, counts jsonb NOT NULL,"
    " ran_at timestamptz NOT NULL DEFAULT clock_timestamp())"
)

app = create_app(
    "batch_app",
    retry_policies={
        QUEUE: RetryPolicy(
            max_attempts=2,
            base=timedelta(milliseconds=100),
            cap=timedelta(milliseconds=100),
            rationale="tests: a retry within the test's time box",
        )
    },
    task_default_queue=QUEUE,
)
_port: QueuePort | None = None


class Broken(Exception):
    """Listed in permanent_errors: dead-lettered at once."""


class Child(BaseModel):
    fail: bool = False
    add: int = 0


class Fired(BaseModel):
    name: str
    batch_id: str
    counts: dict[str, int]


def port() -> QueuePort:
    global _port
    if _port is None:
        _port = QueuePort(app)
    return _port


@app.task(name=CHILD, base=PlatformTask, data_model=Child, permanent_errors=(Broken,))
def child(envelope: Envelope[Child], tx: Any) -> None:
    job = str(envelope.job_id)
    tx.execute("INSERT INTO public.batch_effects (job_id, pid) VALUES (%s, %s)", (job, os.getpid()))
    if envelope.data.fail:
        tx.execute("SELECT 1 FROM public.batch_fixed WHERE job_id = %s", (job,))
        if tx.fetchone() is None:
            raise Broken(f"child {job} fails until fixed")
    if envelope.data.add:
        batch = batch_of(port())
        for _ in range(envelope.data.add):
            batch.publish(QUEUE, {"tenant_id": envelope.tenant_id, "kind": CHILD, "data": {}})


@app.task(name=CALLBACK, base=PlatformTask, data_model=Fired)
def callback(envelope: Envelope[Fired], tx: Any) -> None:
    tx.execute(
        "INSERT INTO public.batch_callbacks (job_id, batch_id, name, counts) "
        "VALUES (%s, %s, %s, %s::jsonb)",
        (
            str(envelope.job_id),
            envelope.data.batch_id,
            envelope.data.name,
            json.dumps(envelope.data.counts),
        ),
    )
