"""Per-tenant cron fan-out: one reliable fan-out job per point, one envelope per tenant.

    # beat_schedules/maintenance/freshness.py (an app made by create_app needs nothing else)
    from platform_tasks.fanout import fan_out

    def run(ctx):
        fan_out(ctx, queue="maintenance", kind="maintenance.recompute_freshness", tiers="due")

Modules: :mod:`.call` (``fan_out``), :mod:`.consumer` (the fan-out consumer task),
:mod:`.sources` (tenants from PostgreSQL), :mod:`.tiers` (which tiers are due),
:mod:`.ids` (deterministic job ids), :mod:`.progress` (resume markers),
:mod:`.publisher` (batched publishing), :mod:`.metrics`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from platform_tasks.app_state import AppState
from platform_tasks.fanout.call import bind, fan_out
from platform_tasks.fanout.ids import fan_out_job_id, tenant_job_id
from platform_tasks.fanout.request import FANOUT_KIND, FANOUT_QUEUE, FanOutRequest
from platform_tasks.fanout.tiers import TIERS, due_tiers, is_due

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = [
    "FANOUT_KIND",
    "FANOUT_QUEUE",
    "TIERS",
    "FanOutRequest",
    "due_tiers",
    "fan_out",
    "fan_out_job_id",
    "install",
    "install_default",
    "is_due",
    "tenant_job_id",
]


_INSTALLED: AppState[bool] = AppState("platform_fanout_installed")


def install(app: PlatformCelery, port: Any = None, *, start_up_checks: bool = True) -> None:
    """Register the fan-out consumer on ``app`` (once) and bind the port ``fan_out`` uses.

    ``create_app`` calls it for every app with no port: ``fan_out`` then publishes with
    the app's own :class:`~platform_tasks.publishing.queue_port.QueuePort`. Call it yourself only to
    make ``fan_out`` use another queue port, or on an app not made by ``create_app``.
    A plain ``Celery()`` app only gets the port bound: the consumer is a PlatformTask,
    which runs on the workers of an app made by ``create_app``, not on a plain app.
    """
    if getattr(app, "platform_settings", None) is None:
        bind(app, port)
        return
    if not _INSTALLED.get(app):
        from platform_tasks.fanout.consumer import install_consumer

        install_consumer(app, start_up_checks=start_up_checks)
        _INSTALLED.set(app, True)
    bind(app, port)


def install_default(app: PlatformCelery) -> None:
    """What ``create_app`` installs: fan-out on the app's own port, when it has a database.

    The fan-out consumer is a PlatformTask reading tenants from PostgreSQL, so an app with
    no ``PLATFORM_DATABASE_URL`` (a beat-only or job-only deployment) is left without it:
    registering it there would make its workers refuse to start for a consumer they never
    run. ``fan_out`` on such an app names the missing setting. For the same reason the
    consumer installed here adds no start-up check: a worker whose database is not
    migrated still starts, and a fan-out job it receives waits like any job during a
    database outage.
    """
    if app.platform_settings.database_url is None:
        return
    install(app, start_up_checks=False)
