"""Worker app of ``bench/fair_gauges.py``: the fair bench's job, and a second queue.

``backlog`` is declared so the worker's queue gauges measure it, but the bench starts
the worker with ``-Q default``: the tenants waiting on ``backlog`` stay there for every
scrape while the probe jobs on ``default`` run.
"""

from __future__ import annotations

from kombu import Queue

from bench.fair_bench_app import app, fair_stamp

BACKLOG = "backlog"

app.conf.task_queues = [Queue("default"), Queue(BACKLOG)]

__all__ = ["BACKLOG", "app", "fair_stamp"]
