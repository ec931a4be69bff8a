"""The ``celery`` command plugin of platform-tasks (entry point group ``celery.commands``).

Celery imports every ``celery.commands`` plugin whenever a ``celery`` command starts
(``flower`` arrives the same way). That is the one way platform code reaches a worker
whose app is a plain ``Celery()`` that never imports platform-tasks, so this module
connects one receiver when it is imported: a trigger of ``LeaseDatabaseScheduler``
arriving at a worker that does not renew its lease is reported once, naming the line to
add (:mod:`platform_tasks.contrib.beat_leases`). The receiver imports nothing until a
message arrives, and does nothing for apps that renew their leases.

The command itself, ``celery -A app lease-renewal``, says whether that app's workers
renew and release those leases (exit status 1 when they do not).
"""

from __future__ import annotations

from typing import Any

import click
from celery.bin.base import CeleryCommand
from celery.signals import task_received

__all__ = ["lease_renewal"]


def _on_received(**kwargs: Any) -> None:
    from platform_tasks.contrib.beat_leases import on_received

    on_received(**kwargs)


# The same dispatch_uid as beat_leases' own receiver: whichever connects first is the one.
task_received.connect(_on_received, weak=False, dispatch_uid="platform_tasks.lease.received")


@click.command("lease-renewal", cls=CeleryCommand)
@click.pass_context
def lease_renewal(ctx: click.Context) -> None:
    """Say whether this app's workers renew and release LeaseDatabaseScheduler's leases."""
    from platform_tasks.contrib.beat_leases import INSTALL_LINE, renews_leases

    app = ctx.obj.app
    if renews_leases(app):
        click.echo(
            f"{app.main or 'the app'}: workers renew and release the leases of "
            "LeaseDatabaseScheduler's triggers"
        )
        return
    click.echo(
        f"{app.main or 'the app'}: workers do NOT renew or release the leases of "
        f"LeaseDatabaseScheduler's triggers; add to the app module: {INSTALL_LINE}",
        err=True,
    )
    ctx.exit(1)
