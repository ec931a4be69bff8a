"""Nightly reconciliation: each tenant's ledger total against its stored balance."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from example_maintenance import QUEUE, every
from platform_tasks.fanout import fan_out
from platform_tasks.jobs import define_job


def run(ctx: Any) -> None:
    fan_out(ctx, queue=QUEUE, kind="example.reconcile")


job = define_job(handler=run, interval=every(timedelta(days=1)))
