"""The console login ``platform-tasks dev`` prints: a development login, or the operator's.

A newcomer running ``make run`` should be in the console within the first minute, without
reading how users are created. So ``dev`` starts the console with an admin user ``dev``
whose password it makes once (random, 16 characters), keeps in the data directory (a file
only its owner can read, ``.data/console-login``) and prints, saying it is for
development only. The same password is reused on the next run, so a browser's saved
login keeps working.

An operator who set ``PLATFORM_CONSOLE_ADMIN_PASSWORD`` chose their own login: the
console uses it (user ``PLATFORM_CONSOLE_ADMIN_USER``, default ``admin``) and ``dev``
names the variable without ever printing its value.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from platform_tasks.cli.console import ADMIN_PASSWORD_ENV, ADMIN_USER_ENV

__all__ = ["DEV_USER", "LOGIN_FILE", "DevLogin", "dev_login"]

DEV_USER = "dev"
LOGIN_FILE = "console-login"
"""File name, in the data directory, of the development password."""


@dataclass(frozen=True)
class DevLogin:
    """The console's admin login while ``platform-tasks dev`` runs."""

    username: str
    password: str | None
    """The development password; ``None`` when the operator's own is used (never shown)."""
    kept_in: Path | None = None

    def console_env(self) -> dict[str, str]:
        """Variables the console process is started with (it sets the user at start)."""
        if self.password is None:
            return {}
        return {ADMIN_USER_ENV: self.username, ADMIN_PASSWORD_ENV: self.password}

    def describe(self) -> str:
        """The line ``dev`` prints after ``Login``."""
        if self.password is None:
            return f"{self.username} / the password in {ADMIN_PASSWORD_ENV} (not shown)"
        return (
            f"{self.username} / {self.password} (development only: made by platform-tasks "
            f"dev, kept in {self.kept_in}; never use it in production)"
        )


def dev_login(data_dir: Path, environ: Mapping[str, str] = os.environ) -> DevLogin:
    """The operator's login when ``PLATFORM_CONSOLE_ADMIN_PASSWORD`` is set, else the
    development login kept in ``data_dir`` (made on first use)."""
    if environ.get(ADMIN_PASSWORD_ENV):
        return DevLogin(environ.get(ADMIN_USER_ENV) or "admin", None)
    path = data_dir / LOGIN_FILE
    password = path.read_text().strip() if path.exists() else ""
    if not password:
        password = secrets.token_urlsafe(12)
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(password + "\n")
    return DevLogin(DEV_USER, password, path)
