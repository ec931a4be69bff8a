"""The console login ``platform-tasks dev`` prints: a development one it keeps, or the
operator's, whose password is never shown."""

from __future__ import annotations

from pathlib import Path

from platform_tasks.cli.dev_login import DEV_USER, dev_login


def test_a_development_login_is_made_once_kept_private_and_said_to_be_for_development(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    first = dev_login(data, environ={})
    assert first.username == DEV_USER and first.password and len(first.password) >= 16
    assert (data / "console-login").stat().st_mode & 0o777 == 0o600
    assert dev_login(data, environ={}) == first, "the next run reuses the same password"
    assert first.console_env() == {
        "PLATFORM_CONSOLE_ADMIN_USER": DEV_USER,
        "PLATFORM_CONSOLE_ADMIN_PASSWORD": first.password,
    }
    line = first.describe()
    assert first.password in line and "development only" in line and "production" in line


def test_the_operators_own_password_is_used_and_never_shown(tmp_path: Path) -> None:
    secret = "Operator-Chosen-Secret-1"
    login = dev_login(
        tmp_path,
        environ={
            "PLATFORM_CONSOLE_ADMIN_PASSWORD": secret,
            "PLATFORM_CONSOLE_ADMIN_USER": "ops",
        },
    )
    assert login.username == "ops" and login.password is None
    assert login.console_env() == {}, "the console reads the operator's variables itself"
    assert secret not in login.describe()
    assert "PLATFORM_CONSOLE_ADMIN_PASSWORD" in login.describe()
    assert not (tmp_path / "console-login").exists()
