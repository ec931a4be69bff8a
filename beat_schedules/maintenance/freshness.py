"""Data-freshness recomputes: hourly, each tenant whose freshness tier is due this UTC hour.

Interval, not cron: points on whole UTC hours whatever the zone, so no DST night drops or
repeats an hour of the ``1h`` tier.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from example_maintenance import QUEUE, every
from platform_tasks.fanout import fan_out
from platform_tasks.jobs import define_job


def run(ctx: Any) -> None:
    fan_out(ctx, queue=QUEUE, kind="example.recompute_freshness", tiers="due")


job = define_job(handler=run, interval=every(timedelta(hours=1)))
