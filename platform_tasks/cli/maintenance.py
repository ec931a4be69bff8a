"""``platform-tasks maintenance``: housekeeping runnable by hand or from cron.

The same functions run as scheduled jobs; the commands exist so an operator can run a
cleanup now (e.g. before the first scheduled run, or after raising the TTL).
"""

from __future__ import annotations

import sys

import click

from platform_tasks.cli.common import cli_error, database_settings
from platform_tasks.postgres.maintenance import (
    DEFAULT_PURGE_BATCH_SIZE,
    purge_processed_jobs,
    report_stale_dead_letters,
)


@click.group()
def maintenance() -> None:
    """Housekeeping of schema core."""


@maintenance.command("purge-processed-jobs")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=DEFAULT_PURGE_BATCH_SIZE,
    show_default=True,
    help="Rows deleted per short transaction.",
)
def purge_processed_jobs_command(batch_size: int) -> None:
    """Delete idempotency rows, delivery marks and completed job batches older than
    PLATFORM_PROCESSED_JOBS_TTL_DAYS (default 30)."""
    settings = database_settings()
    try:
        result = purge_processed_jobs(settings, batch_size=batch_size)
    except Exception as exc:  # psycopg2 errors too: report, do not dump a traceback
        raise cli_error(exc, settings) from None
    click.echo(
        f"deleted {result.deleted} processed_jobs rows, {result.marks_deleted} delivery marks "
        f"and {result.batches_deleted} completed job batches older than "
        f"{result.cutoff.isoformat()} in {result.batches} transactions ({result.seconds:.2f}s)"
    )


@maintenance.command("report-stale-dead-letters")
def report_stale_dead_letters_command() -> None:
    """Alert when dead letters wait longer than PLATFORM_DEAD_LETTER_ALERT_AGE_HOURS.

    Exits 1 when stale rows exist, so a cron wrapper can notice without Sentry.
    """
    settings = database_settings()
    try:
        stale = report_stale_dead_letters(settings)
    except Exception as exc:
        raise cli_error(exc, settings) from None
    hours = settings.dead_letter_alert_age_hours
    click.echo(f"{stale} dead letter(s) pending review for more than {hours:g} hours")
    if stale:
        sys.exit(1)
