"""Notification settings: defaults, the rate-limit syntax, errors naming the variable."""

from __future__ import annotations

import pytest

from platform_tasks.errors import SettingsError
from platform_tasks.settings import PlatformSettings
from platform_tasks.settings.rate_limits import RateLimit, parse_rate_limits


def test_defaults() -> None:
    settings = PlatformSettings.from_env({})
    assert settings.notification_channels == ["email"]
    assert settings.provider_rate_limits == {"resend": RateLimit(5, 1)}
    assert settings.tenant_rate_limits == {}
    assert (settings.marketing_pause_depth, settings.marketing_resume_depth) == (100, 10)
    assert settings.resend_api_key is None
    assert settings.resend_base_url == "https://api.resend.com"


def test_rate_limit_syntax() -> None:
    assert parse_rate_limits("resend=50/s, sms=120/min,push=3600/h") == {
        "resend": RateLimit(50, 1),
        "sms": RateLimit(120, 60),
        "push": RateLimit(3600, 3600),
    }
    assert RateLimit(120, 60).per_second == 2
    assert RateLimit(10, 60).capacity == 10  # one period's worth
    assert RateLimit(0.5, 1).capacity == 1  # at least one token
    assert RateLimit(48, 1).provider_capacity == 2  # 5 % of a second's worth
    assert RateLimit(5, 1).provider_capacity == 1
    assert parse_rate_limits("") == {}


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PLATFORM_PROVIDER_RATE_LIMITS", "resend=5"),
        ("PLATFORM_PROVIDER_RATE_LIMITS", "resend=5/day"),
        ("PLATFORM_PROVIDER_RATE_LIMITS", "resend=0/s"),
        ("PLATFORM_PROVIDER_RATE_LIMITS", "resend=5/s,resend=6/s"),
        ("PLATFORM_TENANT_RATE_LIMITS", "=5/s"),
        ("PLATFORM_NOTIFICATION_CHANNELS", "Email"),
        ("PLATFORM_NOTIFICATION_CHANNELS", "email.x"),
        ("PLATFORM_NOTIFICATION_CHANNELS", " , "),
        ("PLATFORM_MARKETING_PAUSE_DEPTH", "0"),
        ("PLATFORM_MARKETING_RESUME_DEPTH", "100"),
        ("PLATFORM_RESEND_BASE_URL", "api.resend.com"),
        ("PLATFORM_RESEND_BASE_URL", "https://user:pw@api.resend.com"),
        ("PLATFORM_RESEND_BASE_URL", "http://"),
        ("PLATFORM_RESEND_BASE_URL", "https://api.resend.com:x/"),
    ],
)
def test_bad_value_names_the_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError) as info:
        PlatformSettings.from_env({variable: value})
    assert [var for var, _ in info.value.problems] == [variable]


def test_api_key_is_secret() -> None:
    settings = PlatformSettings.from_env({"PLATFORM_RESEND_API_KEY": "re_123456789"})
    assert settings.resend_api_key is not None
    assert settings.resend_api_key.get_secret_value() == "re_123456789"
    assert "re_123456789" not in repr(settings)
    assert "re_123456789" not in str(settings.model_dump())


@pytest.mark.parametrize(
    "url",
    [
        "http://api.resend.com",
        "http://10.0.0.5:8080",
        "http://[2001:db8::1]",
        "http://localhost.example.com",
        "http://127.0.0.1.nip.io",
    ],
)
def test_plain_http_to_a_host_that_is_not_loopback_is_refused(url: str) -> None:
    """The API key travels in every request's Authorization header: in clear text only
    over the loopback interface (a local stand-in of the provider)."""
    with pytest.raises(SettingsError) as info:
        PlatformSettings.from_env({"PLATFORM_RESEND_BASE_URL": url})
    assert [var for var, _ in info.value.problems] == ["PLATFORM_RESEND_BASE_URL"]
    assert "loopback" in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "https://api.resend.com",
        "https://10.0.0.5:8443/",
        "http://127.0.0.1:8025",
        "http://127.3.2.1",
        "http://[::1]:8025",
        "http://localhost:8025",
        "HTTP://LOCALHOST",
    ],
)
def test_https_anywhere_and_plain_http_on_loopback_are_accepted(url: str) -> None:
    settings = PlatformSettings.from_env({"PLATFORM_RESEND_BASE_URL": url})
    assert settings.resend_base_url == url.rstrip("/")
