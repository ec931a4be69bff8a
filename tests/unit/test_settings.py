"""Settings: defaults, parsing, and errors that name the variable."""

from __future__ import annotations

import pytest

from platform_tasks.errors import SettingsError
from platform_tasks.settings import PlatformSettings


def test_defaults() -> None:
    settings = PlatformSettings.from_env({})
    assert settings.max_payload_bytes == 262_144
    assert settings.processed_jobs_ttl_days == 30
    assert settings.effective_broker_url == settings.redis_url
    assert settings.jobs_enabled is True


def test_broker_defaults_to_redis_url_unless_set() -> None:
    env = {"PLATFORM_REDIS_URL": "redis://10.0.0.1:6379/1"}
    assert PlatformSettings.from_env(env).effective_broker_url == "redis://10.0.0.1:6379/1"
    env["PLATFORM_BROKER_URL"] = "redis://10.0.0.2:6379/0"
    assert PlatformSettings.from_env(env).effective_broker_url == "redis://10.0.0.2:6379/0"


def test_comma_separated_globs() -> None:
    settings = PlatformSettings.from_env({"PLATFORM_JOBS_INCLUDE": "billing/*.py, ops/*.py"})
    assert settings.jobs_include == ["billing/*.py", "ops/*.py"]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PLATFORM_MAX_PAYLOAD_BYTES", "lots"),
        ("PLATFORM_MAX_PAYLOAD_BYTES", "10"),
        ("PLATFORM_PROCESSED_JOBS_TTL_DAYS", "0"),
        ("PLATFORM_DATABASE_URL", "mysql://db/x"),
        ("PLATFORM_REDIS_URL", "localhost:6379"),
        ("PLATFORM_JOBS_ENABLED", "perhaps"),
        ("PLATFORM_TRANSPORT", "carrier-pigeon"),
        ("PLATFORM_VISIBILITY_TIMEOUT_SECONDS", "1"),
    ],
)
def test_bad_value_names_the_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError) as info:
        PlatformSettings.from_env({variable: value})
    assert [var for var, _ in info.value.problems] == [variable]
    assert variable in str(info.value)


def test_every_bad_variable_is_reported_together() -> None:
    with pytest.raises(SettingsError) as info:
        PlatformSettings.from_env(
            {"PLATFORM_MAX_PAYLOAD_BYTES": "x", "PLATFORM_PROCESSED_JOBS_TTL_DAYS": "-1"}
        )
    assert {var for var, _ in info.value.problems} == {
        "PLATFORM_MAX_PAYLOAD_BYTES",
        "PLATFORM_PROCESSED_JOBS_TTL_DAYS",
    }


def test_process_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLATFORM_PROFILE", "production")
    monkeypatch.setenv("SENTRY_DSN", "https://key@sentry.example/1")
    settings = PlatformSettings.from_env()
    assert settings.profile == "production"
    assert settings.sentry_dsn == "https://key@sentry.example/1"
