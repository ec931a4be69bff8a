"""Better Stack settings: both or neither, an http(s) URL, bounded sender timings.

Settings that cannot work are refused when they are read (the worker does not start),
naming the variable and never printing the token.
"""

from __future__ import annotations

import pytest

from platform_tasks.errors import SettingsError
from platform_tasks.settings import PlatformSettings

TOKEN = "bs_unit_token_d41d8cd9"


def _problems(env: dict[str, str]) -> str:
    with pytest.raises(SettingsError) as info:
        PlatformSettings.from_env(env)
    text = str(info.value)
    assert TOKEN not in text
    return text


def test_a_token_without_a_url_is_refused_naming_the_url() -> None:
    text = _problems({"PLATFORM_BETTERSTACK_API_TOKEN": TOKEN})
    assert "PLATFORM_BETTERSTACK_API_URL: " in text
    assert "required when PLATFORM_BETTERSTACK_API_TOKEN is set" in text


def test_a_url_without_a_token_is_refused() -> None:
    text = _problems({"PLATFORM_BETTERSTACK_API_URL": "https://uptime.betterstack.com"})
    assert "PLATFORM_BETTERSTACK_API_URL: " in text
    assert "without PLATFORM_BETTERSTACK_API_TOKEN" in text


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("uptime.betterstack.com", "http(s):// URL"),
        ("ftp://uptime.betterstack.com", "http(s):// URL"),
        ("http://uptime.betterstack.com", "loopback"),
        ("https://user:pw@uptime.betterstack.com", "without credentials"),
    ],
)
def test_a_url_that_cannot_carry_the_token_safely_is_refused(url: str, why: str) -> None:
    text = _problems({"PLATFORM_BETTERSTACK_API_TOKEN": TOKEN, "PLATFORM_BETTERSTACK_API_URL": url})
    assert "PLATFORM_BETTERSTACK_API_URL: " in text and why in text


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PLATFORM_ALERT_SEND_INTERVAL_SECONDS", "0"),
        ("PLATFORM_ALERT_RETRY_SECONDS", "-1"),
        ("PLATFORM_ALERT_TIMEOUT_SECONDS", "0"),
        ("PLATFORM_ALERT_TIMEOUT_SECONDS", "600"),
    ],
)
def test_sender_timings_are_bounded(variable: str, value: str) -> None:
    assert f"{variable}: " in _problems({variable: value})


def test_both_set_is_accepted_and_the_token_stays_secret() -> None:
    settings = PlatformSettings.from_env(
        {
            "PLATFORM_BETTERSTACK_API_TOKEN": TOKEN,
            "PLATFORM_BETTERSTACK_API_URL": "https://uptime.betterstack.com/",
        }
    )
    assert settings.betterstack_api_url == "https://uptime.betterstack.com"
    assert TOKEN not in repr(settings) and TOKEN not in str(settings.model_dump())


def test_neither_set_is_no_better_stack_and_empty_values_count_as_unset() -> None:
    settings = PlatformSettings.from_env(
        {"PLATFORM_BETTERSTACK_API_TOKEN": " ", "PLATFORM_BETTERSTACK_API_URL": ""}
    )
    assert settings.betterstack_api_token is None and settings.betterstack_api_url is None
    assert settings.alert_send_interval_seconds == 5.0
    assert settings.alert_retry_seconds == 30.0
    assert settings.alert_timeout_seconds == 5.0
