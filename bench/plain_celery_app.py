"""Worker app of ``bench/celery_baselines.py``: a plain Celery app as a user writes it.

Celery's defaults (stock kombu Redis transport, task events off unless the worker gets
``-E``), with only the settings the comparison fixes for every row: late acks and the
broker URL. The prefetch multiplier is given on the worker command line.
"""

from __future__ import annotations

import os

from celery import Celery

app = Celery("plain_bench", broker=os.environ["PLATFORM_REDIS_URL"])
app.conf.task_acks_late = True
app.conf.broker_connection_retry_on_startup = True


@app.task(name="bench.noop")
def noop() -> None:
    """Does nothing: only the broker path and Celery's own work are measured."""
