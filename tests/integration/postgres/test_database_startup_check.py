"""``require_database_url``: the start-up test connection, against a real PostgreSQL."""

from __future__ import annotations

import pytest

from platform_tasks.errors import ConfigurationError
from platform_tasks.postgres.database import require_database_url
from platform_tasks.postgres.migrations import migrate
from platform_tasks.settings import PlatformSettings
from tests.conftest import ServerFactory


def _with_password(url: str, password: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{password}@")


def test_checked_once_per_process_so_a_later_outage_is_not_a_startup_error(
    server_factory: ServerFactory,
) -> None:
    server = server_factory.postgres()
    url = _with_password(server.url, "once-pw")
    migrate(url)  # a usable database: reachable and migrated
    settings = PlatformSettings.build(database_url=url)
    assert require_database_url(settings) == url
    server.stop()
    # the job path calls it again during an outage: it must not become a start-up error
    assert require_database_url(settings) == url
    # a URL never checked in this process is checked, and refused while the server is down
    other = PlatformSettings.build(database_url=url.replace("/platform", "/postgres"))
    with pytest.raises(ConfigurationError) as info:
        require_database_url(other, connect_timeout=2)
    text = str(info.value)
    assert text.startswith("PLATFORM_DATABASE_URL (postgresql://postgres:***@127.0.0.1")
    assert "cannot connect before consuming" in text
    assert "once-pw" not in text


def test_unset_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="PLATFORM_DATABASE_URL is not set"):
        require_database_url(PlatformSettings.build())
