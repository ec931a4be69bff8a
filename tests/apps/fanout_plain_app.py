"""An application as a new user writes it: ``create_app`` and one tenant consumer, nothing else.

No ``platform_tasks.fanout.install`` line: a job in ``beat_schedules/`` calling ``fan_out``
must work with this alone. The consumer records every application of a tenant job as a
row of ``public.fanout_applied`` (no unique key: a job applied twice shows as two rows).
"""

from __future__ import annotations

from typing import Any

from platform_tasks import PlatformTask, create_app

WORK_QUEUE = "tenant_work"
KIND = "tenant_work.apply"

app = create_app("fanout_plain_app")


@app.task(base=PlatformTask, name=KIND, queue=WORK_QUEUE)
def apply(envelope: Any, tx: Any) -> None:
    tx.execute(
        "INSERT INTO public.fanout_applied (job_id, tenant_id, point) VALUES (%s, %s, %s)",
        (str(envelope.job_id), envelope.tenant_id, envelope.data["scheduled_for"]),
    )
