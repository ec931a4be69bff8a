"""The ``platform-tasks`` console script: one click group, one module per command family."""

from __future__ import annotations

import click

from platform_tasks.cli.dead_letters import dead_letters
from platform_tasks.cli.dev import dev
from platform_tasks.cli.jobs import jobs
from platform_tasks.cli.maintenance import maintenance
from platform_tasks.cli.migrate import migrate


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Operate a platform-tasks deployment: migrations, dead letters, scheduled jobs."""


main.add_command(migrate)
main.add_command(dead_letters)
main.add_command(jobs)
main.add_command(maintenance)
main.add_command(dev)

__all__ = ["main"]
