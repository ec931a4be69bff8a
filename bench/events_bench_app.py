"""Worker app of ``bench/celery_baselines.py``: the platform app, task events on or off.

``BENCH_TASK_EVENTS=0`` turns the platform's task events off, to show what they cost;
by default they are on, as ``create_app`` sets them. ``BENCH_CELERY_DISPATCHER=1`` sends
them through Celery's own dispatcher instead of the platform's batching one (the
"before" of ``platform_tasks.observability.event_batching``).
"""

from __future__ import annotations

import os
from typing import Any

from platform_tasks import PlatformTask, create_app

app = create_app(
    "events_bench", worker_send_task_events=os.environ.get("BENCH_TASK_EVENTS", "1") != "0"
)
if os.environ.get("BENCH_CELERY_DISPATCHER") == "1":
    app.events_cls = "celery.app.events:Events"


@app.task(name="bench.noop")
def noop() -> None:
    """Does nothing: only the broker path and Celery's own work are measured."""


@app.task(name="bench.platform_noop", base=PlatformTask)
def platform_noop(envelope: Any, tx: Any) -> None:
    """Does nothing beyond what PlatformTask does: validation and the idempotency commit."""
