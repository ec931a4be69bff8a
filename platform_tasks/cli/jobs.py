"""platform-tasks jobs: job instances (show, list --correlation-id, cancel).

Where one is (``show``), the jobs of one request (``list --correlation-id``), cancelling
waiting ones (``cancel``).

Scheduled job definitions moved to ``platform-tasks schedules``; ``jobs docs``, ``jobs
check`` and ``jobs list`` without ``--correlation-id`` still work, with a notice.
"""

from __future__ import annotations

import click

from platform_tasks.cli import LazyGroup


# Loaded on use: ``docs``/``check`` must not import what the others need (settings, drivers).
@click.group(
    cls=LazyGroup,
    lazy_commands={
        "cancel": "platform_tasks.cli.operations:cancel_command",
        "check": "platform_tasks.cli.schedules:old_check",
        "docs": "platform_tasks.cli.schedules:old_docs",
        "list": "platform_tasks.cli.job_status:list_command",
        "show": "platform_tasks.cli.job_status:show",
    },
)
def jobs() -> None:
    """Job instances: where one is (show), the jobs of one request (list
    --correlation-id), cancel waiting ones (cancel). Scheduled job definitions: see
    `platform-tasks schedules`."""
