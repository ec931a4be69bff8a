"""The standalone console's settings helpers: its schema is never ``core``, bad database
URLs are named, and ``--host`` joins the allowed hosts."""

from __future__ import annotations

import pytest

from platform_tasks.contrib.django.settings_values import (
    LOOPBACK_HOSTS,
    console_schema,
    database_from_url,
    with_host,
)
from platform_tasks.errors import SettingsError


@pytest.mark.parametrize("bad", ["core", "Console", "1abc", "a-b", "pg_catalog"])
def test_schema_names_core_and_non_identifiers_are_refused(bad: str) -> None:
    with pytest.raises(SettingsError, match="PLATFORM_CONSOLE_SCHEMA"):
        console_schema(bad)


def test_the_default_schema_is_console_via_search_path() -> None:
    assert console_schema(None) == "console"
    entry = database_from_url("postgresql://u:p%40ss@db.example:6543/platform", "console")
    assert entry["OPTIONS"]["options"] == "-c search_path=console"
    assert (entry["NAME"], entry["USER"], entry["PASSWORD"], entry["HOST"], entry["PORT"]) == (
        "platform",
        "u",
        "p@ss",
        "db.example",
        "6543",
    )


@pytest.mark.parametrize("url", [None, "", "mysql://u@h/db", "postgresql://u@h"])
def test_a_bad_database_url_names_the_setting(url: str | None) -> None:
    with pytest.raises(SettingsError, match="PLATFORM_DATABASE_URL"):
        database_from_url(url, "console")


def test_the_bound_host_joins_the_loopback_names() -> None:
    assert with_host("127.0.0.1") == LOOPBACK_HOSTS
    assert with_host("10.0.0.5") == [*LOOPBACK_HOSTS, "10.0.0.5"]
    assert with_host("fd00::5")[-2:] == ["fd00::5", "[fd00::5]"]
