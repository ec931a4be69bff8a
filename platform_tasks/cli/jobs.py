"""``platform-tasks jobs``: the runtime listing and the static docs/check commands."""

from __future__ import annotations

import click

from platform_tasks.cli import LazyGroup


# Loaded on use: ``docs``/``check`` must not import what ``list`` needs (job code, settings).
@click.group(
    cls=LazyGroup,
    lazy_commands={
        "cancel": "platform_tasks.cli.operations:cancel_command",
        "check": "platform_tasks.cli.jobs_static:check",
        "docs": "platform_tasks.cli.jobs_static:docs",
        "list": "platform_tasks.cli.jobs_runtime:list_jobs",
    },
)
def jobs() -> None:
    """Inspect scheduled job definitions (runtime listing or static evidence); cancel
    waiting jobs by filter."""
