"""Start-up of the standalone console: its schema, its tables, its groups, its admin user,
then the WSGI server.

Run by ``platform-tasks console`` after Django is set up with the bundled settings.
Preparing is serialised by a PostgreSQL advisory lock, so two consoles starting at once
do not race each other's migrations. The admin password comes from the environment or a
prompt and is never printed or logged.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.auth.password_validation import (
    validate_password,
)
from django.core.management import call_command
from django.db import connection, transaction

from platform_tasks.contrib.django.apps import APP_LABEL
from platform_tasks.contrib.django.exposure import is_loopback
from platform_tasks.contrib.django.permissions import GROUPS
from platform_tasks.errors import ConfigurationError

__all__ = ["ROLES", "prepare", "serve", "set_user"]

logger = logging.getLogger("platform_tasks.contrib.django.server")

_LOCK = "platform-tasks console prepare"
ROLES = ("admin", "operator", "viewer")
"""``admin``: a Django superuser (all permissions, manages users in the admin);
``operator``: group ``console operators``; ``viewer``: group ``console viewers``."""
_ROLE_GROUP = {"operator": "console operators", "viewer": "console viewers"}


def _core_ready() -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass('core.dead_letters'), to_regclass('core.operations')")
        dead_letters, operations = cur.fetchone()
    if dead_letters is None or operations is None:
        raise ConfigurationError(
            "PLATFORM_DATABASE_URL has no core.dead_letters / core.operations: run "
            "'platform-tasks migrate' against it first"
        )


def prepare() -> None:
    """The console schema and Django's tables in it, the two role groups; idempotent."""
    schema = django_settings.CONSOLE_SCHEMA
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(hashtext(%s))", [_LOCK])
        try:
            _core_ready()
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {connection.ops.quote_name(schema)}")
            call_command("migrate", interactive=False, verbosity=0)
            sync_groups()
        finally:
            cur.execute("SELECT pg_advisory_unlock(hashtext(%s))", [_LOCK])


@transaction.atomic
def sync_groups() -> None:
    """``console viewers`` and ``console operators`` hold exactly their permissions."""
    for name, codenames in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        wanted = Permission.objects.filter(
            content_type__app_label=APP_LABEL, codename__in=codenames
        )
        missing = set(codenames) - set(wanted.values_list("codename", flat=True))
        if missing:
            raise ConfigurationError(f"console permissions missing: {', '.join(sorted(missing))}")
        group.permissions.set(wanted)


def set_user(username: str, password: str, role: str) -> bool:
    """Create ``username`` or reset its password and role; True when created.

    The password goes through Django's validators (the setting
    ``AUTH_PASSWORD_VALIDATORS``); their messages never quote it."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if not username.strip():
        raise ValueError("the user name must not be empty")
    model: Any = get_user_model()
    with transaction.atomic():
        user, created = model.objects.get_or_create(username=username)
        validate_password(password, user=user)
        user.set_password(password)
        user.is_active = True
        user.is_staff = True
        user.is_superuser = role == "admin"
        user.save()
        user.groups.set([] if role == "admin" else [Group.objects.get(name=_ROLE_GROUP[role])])
    logger.info(
        "console user %s %s with role %s",
        username,
        "created" if created else "updated",
        role,
        extra={"event": "console.user_saved", "user": username, "role": role},
    )
    return bool(created)


PROXY_HEADERS = {"x-forwarded-for", "x-forwarded-proto"}
"""What waitress believes from the peer behind a TLS proxy: the client's address (the
last ``X-Forwarded-For`` entry, which the proxy appended) and the scheme (``https``)."""


def serve(host: str, port: int, *, threads: int, behind_tls_proxy: bool = False) -> None:
    """Serve the console with waitress until interrupted.

    Behind a TLS proxy waitress takes the client's address and scheme from the proxy's
    headers (any peer's: the port must be reachable by the proxy only, as the start's
    warning says); otherwise it drops those headers, so a client cannot claim another
    address to the login throttle."""
    from waitress import serve as waitress_serve

    from platform_tasks.contrib.django.wsgi import application

    if not django_settings.SECRET_KEY_FROM_ENV:
        logger.warning(
            "PLATFORM_CONSOLE_SECRET_KEY is not set: a random key signs sessions, so every "
            "user logs in again after a restart",
            extra={"event": "console.random_secret_key"},
        )
    display = f"[{host}]" if ":" in host else host
    if not is_loopback(host):
        logger.warning(
            "the console listens beyond loopback on %s:%d with plain HTTP: only the TLS "
            "proxy in front may reach this port (its cookies are Secure, so a browser "
            "reaching it directly cannot log in)",
            display,
            port,
            extra={"event": "console.plain_http_beyond_loopback", "host": host, "port": port},
        )
    logger.info(
        "console listening on http://%s:%d/",
        display,
        port,
        extra={"event": "console.listening", "host": host, "port": port},
    )
    proxy: dict[str, Any] = (
        {"trusted_proxy": "*", "trusted_proxy_count": 1, "trusted_proxy_headers": PROXY_HEADERS}
        if behind_tls_proxy
        else {}
    )
    waitress_serve(
        application,
        host=host,
        port=port,
        threads=threads,
        ident="platform-tasks-console",
        clear_untrusted_proxy_headers=True,
        **proxy,
    )
