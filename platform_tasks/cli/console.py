"""``platform-tasks console``: the operations console in a browser, without a Django project.

``platform-tasks console`` prepares the console (schema ``console`` and Django's tables in
it, the role groups, the admin user from ``PLATFORM_CONSOLE_ADMIN_PASSWORD``) and serves
it with waitress on 127.0.0.1:8000 (``--host``, ``--port``). Beyond loopback it starts
only with ``--behind-tls-proxy`` (:mod:`platform_tasks.contrib.django.exposure`).
``platform-tasks console create-user NAME --role viewer|operator|admin`` adds or resets a
user (password from ``PLATFORM_CONSOLE_PASSWORD`` or a hidden prompt). Passwords are
never printed or logged.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from typing import Any

import click

from platform_tasks.contrib.django.exposure import (
    BEHIND_TLS_PROXY_ENV,
    Exposure,
    check_exposure,
    origin_hosts,
)
from platform_tasks.errors import PlatformError, SettingsError
from platform_tasks.settings import without_secrets

SETTINGS_MODULE = "platform_tasks.contrib.django.settings"
ADMIN_PASSWORD_ENV = "PLATFORM_CONSOLE_ADMIN_PASSWORD"
ADMIN_USER_ENV = "PLATFORM_CONSOLE_ADMIN_USER"
PASSWORD_ENV = "PLATFORM_CONSOLE_PASSWORD"


def _setup(host: str | None = None, exposure: Exposure | None = None) -> None:
    """Django set up with the bundled settings (``--host`` and the proxy's origins added
    to the allowed hosts)."""
    if host and "PLATFORM_CONSOLE_ALLOWED_HOSTS" not in os.environ:
        from platform_tasks.contrib.django.settings_values import LOOPBACK_HOSTS, with_host

        names = list(LOOPBACK_HOSTS) if _wildcard(host) else with_host(host)
        if exposure is not None and exposure.behind_tls_proxy:
            names += [n for n in origin_hosts(list(exposure.trusted_origins)) if n not in names]
        os.environ["PLATFORM_CONSOLE_ALLOWED_HOSTS"] = ",".join(names)
    if exposure is not None and exposure.behind_tls_proxy:
        os.environ[BEHIND_TLS_PROXY_ENV] = "1"
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    try:
        import django
    except ImportError:
        raise click.UsageError(
            "the console needs the django extra: pip install 'platform-tasks[django]'"
        ) from None
    try:
        django.setup()
    except PlatformError as exc:
        raise click.UsageError(str(exc)) from exc


def _wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def _failure(exc: BaseException) -> click.ClickException:
    text = str(exc).strip() or type(exc).__name__
    return click.ClickException(without_secrets(text, os.environ.get("PLATFORM_DATABASE_URL")))


def _prepare() -> None:
    from django.db import Error as DatabaseError

    from platform_tasks.contrib.django.server import prepare

    try:
        prepare()
    except (DatabaseError, PlatformError) as exc:
        raise _failure(exc) from None


def _save_user(username: str, password: str, role: str) -> bool:
    from django.core.exceptions import ValidationError

    from platform_tasks.contrib.django.server import set_user

    try:
        return set_user(username, password, role)
    except ValidationError as exc:
        raise click.UsageError("the password is refused: " + " ".join(exc.messages)) from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@click.group(invoke_without_command=True)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    envvar="PLATFORM_CONSOLE_HOST",
    help="Address to listen on (loopback unless you say otherwise).",
)
@click.option(
    "--port",
    default=8000,
    show_default=True,
    type=click.IntRange(1, 65535),
    envvar="PLATFORM_CONSOLE_PORT",
    help="TCP port to listen on.",
)
@click.option(
    "--threads",
    default=8,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Requests served at once.",
)
@click.option(
    "--behind-tls-proxy",
    is_flag=True,
    default=False,
    help="A TLS-terminating proxy is in front (or PLATFORM_CONSOLE_BEHIND_TLS_PROXY=1): "
    "needed to listen beyond loopback; makes the cookies Secure and needs "
    "PLATFORM_CONSOLE_CSRF_TRUSTED_ORIGINS=https://... .",
)
@click.pass_context
def console(ctx: click.Context, host: str, port: int, threads: int, behind_tls_proxy: bool) -> None:
    """Serve the operations console (dead letters, bulk replay/discard, cancel, pause,
    the operations log) at http://HOST:PORT/ with the bundled settings.

    Needs PLATFORM_DATABASE_URL (migrated with 'platform-tasks migrate'), and the Redis
    and broker settings the workers use. With PLATFORM_CONSOLE_ADMIN_PASSWORD set, the
    admin user (PLATFORM_CONSOLE_ADMIN_USER, default 'admin') is created or its password
    reset at start. It serves plain HTTP: beyond loopback (--host 0.0.0.0) it starts only
    with --behind-tls-proxy and PLATFORM_CONSOLE_CSRF_TRUSTED_ORIGINS naming the proxy's
    https:// origin."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        exposure = check_exposure(host, os.environ, behind_tls_proxy=behind_tls_proxy)
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from None
    _setup(host, exposure)
    _prepare()
    password = os.environ.get(ADMIN_PASSWORD_ENV)
    if password:
        _save_user(os.environ.get(ADMIN_USER_ENV) or "admin", password, "admin")
    else:
        _warn_without_users()
    from platform_tasks.contrib.django.server import serve

    try:
        serve(host, port, threads=threads, behind_tls_proxy=exposure.behind_tls_proxy)
    except OSError as exc:  # the address is taken or cannot be bound
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None


def _warn_without_users() -> None:
    import logging

    from django.contrib.auth import get_user_model

    model: Any = get_user_model()
    if not model.objects.filter(is_active=True).exists():
        logging.getLogger("platform_tasks.contrib.django.server").warning(
            "the console has no user: set %s or run 'platform-tasks console create-user'",
            ADMIN_PASSWORD_ENV,
            extra={"event": "console.no_users"},
        )


@console.command("create-user")
@click.argument("username")
@click.option(
    "--role",
    type=click.Choice(["viewer", "operator", "admin"]),
    default="viewer",
    show_default=True,
    help="viewer: looks only; operator: may act; admin: superuser.",
)
def create_user(username: str, role: str) -> None:
    """Create USERNAME or reset its password and role. The password is read from
    PLATFORM_CONSOLE_PASSWORD, else prompted for (hidden, asked twice)."""
    password = os.environ.get(PASSWORD_ENV)
    if not password:
        if not sys.stdin.isatty():
            raise click.UsageError(f"set {PASSWORD_ENV} or run this in a terminal to be asked")
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    _setup()
    _prepare()
    created = _save_user(username, password, role)
    click.echo(f"{'created' if created else 'updated'} console user {username} ({role})")
