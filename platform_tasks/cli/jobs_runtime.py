"""``platform-tasks jobs list``: the jobs a beat or worker would run, after full validation.

Unlike the static ``docs``/``check`` commands this imports the job files, exactly like
beat does, and shows each job's next point.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click

from platform_tasks.errors import ConfigurationError
from platform_tasks.jobs.discovery import discover_from_settings
from platform_tasks.settings import PlatformSettings


@click.command("list")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def list_jobs(fmt: str) -> None:
    """List discovered jobs (disabled ones too) with their next point."""
    try:
        settings = PlatformSettings.from_env()
        now = datetime.now(UTC)
        jobs = discover_from_settings(settings, now=now)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc
    rows = []
    for job in jobs:
        definition = job.definition
        rows.append({
            "name": job.name,
            "file": str(job.file),
            "schedule": definition.cron or f"every {definition.interval}",
            "timezone": definition.timezone,
            "enabled": definition.enabled,
            "queue": definition.queue,
            "next_point": job.schedule.next_after(now).isoformat() if job.enabled else None,
        })  # fmt: skip
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no scheduled jobs")
        return
    for row in rows:
        state = "enabled" if row["enabled"] else "disabled"
        click.echo(f"{row['name']}\t{row['schedule']}\t{row['timezone']}\t{state}\t"
                   f"{row['queue']}\tnext={row['next_point']}")  # fmt: skip
