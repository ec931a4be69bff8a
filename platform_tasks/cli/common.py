"""What every database command of the CLI needs first: valid settings with a database."""

from __future__ import annotations

import click

from platform_tasks.errors import PlatformError
from platform_tasks.settings import PlatformSettings


def database_settings() -> PlatformSettings:
    """Settings from the environment; bad or missing values are usage errors (exit 2)."""
    try:
        settings = PlatformSettings.from_env()
    except PlatformError as exc:
        raise click.UsageError(str(exc)) from exc
    if not settings.database_url:
        raise click.UsageError("PLATFORM_DATABASE_URL is not set")
    return settings
