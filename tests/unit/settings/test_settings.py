"""Settings: defaults, parsing, and errors that name the variable."""

from __future__ import annotations

import pytest

from platform_tasks.errors import SettingsError
from platform_tasks.settings import PlatformSettings, redact_url, without_secrets


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


SECRET = "pa55-w0rd"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (f"postgresql://app:{SECRET}@db:5432/platform?colour=blue", "invalid URI query parameter"),
        (f"postgresql://app:{SECRET}@db:5432x/platform", "port '5432x'"),
        (f"postgresql://app:{SECRET}@db:99999/platform", "port '99999'"),
        (f"postgresql://app:{SECRET}@db1:5432,db2:x/platform", "port 'x'"),
        (f"postgresql://app:{SECRET}@[::1/platform", "IPv6 host address"),
        (f"postgresql://app:{SECRET}@data base/platform", "host 'data base'"),
        (f"postgresql://app:{SECRET}@db/platform?sslmode=maybe", "sslmode='maybe'"),
        (f"postgresql://app:{SECRET}@db/platform?connect_timeout=soon", "connect_timeout"),
        ("postgresql://app:pa%ZZss@db/platform", "percent-encoded"),
        (f"postgresql://app:{SECRET}@db@host/platform", "%40"),
    ],
)
def test_malformed_database_url_is_refused_without_its_password(url: str, says: str) -> None:
    with pytest.raises(SettingsError) as info:
        PlatformSettings.from_env({"PLATFORM_DATABASE_URL": url})
    text = str(info.value)
    assert [var for var, _ in info.value.problems] == ["PLATFORM_DATABASE_URL"]
    assert says in text
    assert SECRET not in text and "pa%ZZss" not in text
    assert "app:***@" in text


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:pw@db:5432/platform",
        "postgres://db/platform",
        "postgresql://app@[::1]:5432/platform?sslmode=require&connect_timeout=3",
        "postgresql:///platform?host=/var/run/postgresql",
        "postgresql://app:pw@db1:5432,db2:5433/platform?target_session_attrs=read-write",
    ],
)
def test_valid_database_urls_pass(url: str) -> None:
    assert PlatformSettings.from_env({"PLATFORM_DATABASE_URL": url}).database_url == url


def test_redis_url_error_shows_no_password() -> None:
    with pytest.raises(SettingsError) as info:
        PlatformSettings.from_env({"PLATFORM_REDIS_URL": f"user:{SECRET}@redis:6379/0"})
    assert SECRET not in str(info.value)
    assert "PLATFORM_REDIS_URL" in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:pw@db:5432/x", "postgresql://app:***@db:5432/x"),
        ("redis://:pw@redis:6379/0", "redis://:***@redis:6379/0"),
        ("redis://redis:6379/0", "redis://redis:6379/0"),
        ("postgresql://app@db/x", "postgresql://app@db/x"),
        ("postgresql://app:p@ss/w@db/x", "postgresql://app:***@db/x"),
        (
            "postgresql://db/x?user=a&password=pw&sslmode=require",
            "postgresql://db/x?user=a&password=***&sslmode=require",
        ),
        ("not a url at all", "not a url at all"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_without_secrets_masks_the_url_and_its_password_in_any_text() -> None:
    url = f"postgresql://app:{SECRET}@db/x"
    text = f"failed for {url}; password {SECRET}; encoded pa55%2Dw0rd"
    masked = without_secrets(text, url, "postgresql://app:pa55%2Dw0rd@db/x")
    assert SECRET not in masked and "pa55%2Dw0rd" not in masked
    assert "app:***@db/x" in masked
