"""Per-tenant cron fan-out: one reliable fan-out job per point, one envelope per tenant.

    # celery_app.py (the composition root)
    from platform_tasks.fanout import install as install_fanout
    install_fanout(app, queue_port)

    # beat_schedules/maintenance/freshness.py
    from platform_tasks.fanout import fan_out

    def run(ctx):
        fan_out(ctx, queue="maintenance", kind="maintenance.recompute_freshness", tiers="due")

Modules: :mod:`.call` (``fan_out``), :mod:`.consumer` (the fan-out consumer task),
:mod:`.sources` (tenants from PostgreSQL), :mod:`.tiers` (which tiers are due),
:mod:`.ids` (deterministic job ids), :mod:`.progress` (resume markers),
:mod:`.publisher` (batched publishing), :mod:`.metrics`.
"""

from __future__ import annotations

from typing import Any

from platform_tasks.fanout.call import bind_port, fan_out
from platform_tasks.fanout.ids import fan_out_job_id, tenant_job_id
from platform_tasks.fanout.request import FANOUT_KIND, FANOUT_QUEUE, FanOutRequest
from platform_tasks.fanout.tiers import TIERS, due_tiers, is_due

__all__ = [
    "FANOUT_KIND",
    "FANOUT_QUEUE",
    "TIERS",
    "FanOutRequest",
    "due_tiers",
    "fan_out",
    "fan_out_job_id",
    "install",
    "is_due",
    "tenant_job_id",
]


def install(app: Any, port: Any) -> None:
    """Register the fan-out consumer on ``app`` and bind ``port`` for ``fan_out``."""
    from platform_tasks.fanout.consumer import install_consumer

    install_consumer(app)
    bind_port(port)
