"""Points-expiring-soon scan: each tenant's loyalty points expiring within seven days."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from example_maintenance import QUEUE, every
from platform_tasks.fanout import fan_out
from platform_tasks.jobs import define_job


def run(ctx: Any) -> None:
    fan_out(ctx, queue=QUEUE, kind="example.scan_expiring_points", data={"within_days": 7})


job = define_job(handler=run, interval=every(timedelta(days=1)))
