"""``platform-tasks dev`` prints the servers it uses; a password in their URLs never shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from platform_tasks.cli.devserver import DevOptions, DevPlatform
from platform_tasks.errors import SettingsError
from platform_tasks.settings import SECRET_MASK
from platform_tasks.testing.servers import PostgresServer, RedisServer


def _options(tmp_path: Path) -> DevOptions:
    return DevOptions(
        app="celery_app",
        project_dir=tmp_path,
        data_dir=tmp_path / "data",
        flower_port=0,
        beat_replicas=0,
        samples=0,
        jobs_dir=tmp_path / "beat_schedules",
    )


def test_external_server_urls_are_printed_without_their_password(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    redis_server: RedisServer,
    postgres_server: PostgresServer,
) -> None:
    """The test servers trust local connections, so a URL with a password still connects."""
    secret = "s3cret-dev-password"
    db_url = postgres_server.url.replace("://postgres@", f"://postgres:{secret}@", 1)
    assert secret in db_url
    monkeypatch.setenv("PLATFORM_REDIS_URL", redis_server.url)
    monkeypatch.setenv("PLATFORM_DATABASE_URL", db_url)
    lines: list[str] = []
    DevPlatform(_options(tmp_path), lines.append).start_servers()
    output = "\n".join(lines)
    assert "PostgreSQL" in output and "from PLATFORM_DATABASE_URL" in output
    assert secret not in output
    assert f"postgres:{SECRET_MASK}@" in output


def test_a_malformed_url_stops_dev_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cret-dev-password"
    monkeypatch.setenv("PLATFORM_DATABASE_URL", f"postgresql://u:{secret}@localhost:notaport/db")
    lines: list[str] = []
    with pytest.raises(SettingsError) as raised:
        DevPlatform(_options(tmp_path), lines.append).start_servers()
    assert "PLATFORM_DATABASE_URL" in str(raised.value)
    assert secret not in str(raised.value)
    assert lines == []
    assert not (tmp_path / "data").exists()
