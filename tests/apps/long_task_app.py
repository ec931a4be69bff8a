"""An app whose one task may run for an hour: longer than a small RabbitMQ consumer_timeout."""

from __future__ import annotations

from typing import Any

from platform_tasks import Envelope, PlatformTask, create_app

app = create_app("long_task_app")


@app.task(name="tests.long.report", base=PlatformTask, time_limit=3600)
def long_report(envelope: Envelope[Any], tx: Any) -> None:
    """Never runs in the tests: the worker must refuse to start first."""
