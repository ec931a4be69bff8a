"""Worker app of ``bench/transport_throughput.py``: a Celery no-op and a PlatformTask no-op."""

from __future__ import annotations

from typing import Any

from platform_tasks import PlatformTask, create_app

app = create_app("transport_bench")


@app.task(name="bench.noop")
def noop() -> None:
    """Does nothing: only the broker path and Celery's own work are measured."""


@app.task(name="bench.platform_noop", base=PlatformTask)
def platform_noop(envelope: Any, tx: Any) -> None:
    """Does nothing beyond what PlatformTask does: validation and the idempotency commit."""
