"""What the CLI's database commands share: valid settings with a database, one-line
errors with passwords masked, the ``--app`` loader, and exit 1 when nothing matched."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from platform_tasks.errors import PlatformError
from platform_tasks.settings import PlatformSettings, without_secrets


def database_settings() -> PlatformSettings:
    """Settings from the environment; bad or missing values are usage errors (exit 2)."""
    try:
        settings = PlatformSettings.from_env()
    except PlatformError as exc:
        raise click.UsageError(str(exc)) from exc
    if not settings.database_url:
        raise click.UsageError("PLATFORM_DATABASE_URL is not set")
    return settings


def cli_error(exc: BaseException, settings: PlatformSettings | None) -> click.ClickException:
    """A command's failure as one line (exit 1), with every URL's password masked.

    Driver messages may quote the URL they were given (libpq does for a malformed one),
    so nothing reaches the terminal without passing through here.
    """
    text = str(exc).strip() or type(exc).__name__
    if not isinstance(exc, PlatformError | click.ClickException):
        text = f"{type(exc).__name__}: {text}"
    if settings is not None:
        text = without_secrets(text, settings.database_url, settings.redis_url, settings.broker_url)
    return click.ClickException(text)


NOTHING_MATCHED = 1


def exit_if_nothing(count: int, message: str, *, as_json: bool) -> None:
    """Exit 1 when a command changed no row, so scripts can tell; the reason goes to stderr
    except under ``--json``, whose output must stay one parseable document."""
    if count:
        return
    if not as_json:
        click.echo(message, err=True)
    sys.exit(NOTHING_MATCHED)


def load_app(spec: str) -> Any:
    """Import ``module:attr`` from the working directory, as ``celery -A`` does."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise click.BadParameter(f"{spec!r} is not module:attr", param_hint="--app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint="--app"
        ) from exc
    app = getattr(module, attr or "app", None)
    if app is None or not hasattr(app, "platform_settings"):
        raise click.BadParameter(
            f"{spec!r} is not a platform-tasks app (build it with platform_tasks.create_app)",
            param_hint="--app",
        )
    return app
