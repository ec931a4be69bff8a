"""``platform-tasks migrate``: apply or print the schema migrations."""

from __future__ import annotations

import click

from platform_tasks.cli.common import cli_error, database_settings
from platform_tasks.errors import PlatformError
from platform_tasks.postgres.migrations import migrate as apply_migrations
from platform_tasks.postgres.migrations import migration_sql


@click.command()
@click.option("--sql", "print_sql", is_flag=True, help="Print the SQL instead of applying it.")
def migrate(print_sql: bool) -> None:
    """Create or upgrade schema core in PLATFORM_DATABASE_URL."""
    if print_sql:
        click.echo(migration_sql(), nl=False)
        return
    settings = database_settings()
    try:
        applied = apply_migrations(settings.database_url or "")
    except PlatformError as exc:
        raise cli_error(exc, settings) from None
    if applied:
        click.echo(f"applied migrations: {', '.join(f'{v:04d}' for v in applied)}")
    else:
        click.echo("schema core is up to date")
