"""Retention: each tenant's events older than 30 days exported to a file, then purged."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from example_maintenance import QUEUE, every
from platform_tasks.fanout import fan_out
from platform_tasks.jobs import define_job


def run(ctx: Any) -> None:
    fan_out(ctx, queue=QUEUE, kind="example.retention_purge", data={"retention_days": 30})


job = define_job(handler=run, interval=every(timedelta(days=1)))
