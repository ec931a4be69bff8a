"""Where the console may listen: loopback freely, beyond it only behind a TLS proxy that
is named, with secure cookies; every refusal names what to change."""

from __future__ import annotations

import pytest

from platform_tasks.contrib.django.exposure import check_exposure, flag, is_loopback
from platform_tasks.errors import SettingsError

ORIGINS = {"PLATFORM_CONSOLE_CSRF_TRUSTED_ORIGINS": "https://ops.example.com"}


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_needs_nothing(host: str) -> None:
    assert is_loopback(host)
    exposure = check_exposure(host, {}, behind_tls_proxy=False)
    assert not exposure.beyond_loopback and not exposure.secure_cookies


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.2", "ops.internal"])
def test_beyond_loopback_is_refused_without_the_proxy_flag(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(SettingsError) as refused:
        check_exposure(host, ORIGINS, behind_tls_proxy=False)
    assert "--behind-tls-proxy" in str(refused.value)
    assert "PLATFORM_CONSOLE_BEHIND_TLS_PROXY" in str(refused.value)


def test_behind_the_proxy_cookies_are_secure_by_the_flag_or_the_variable() -> None:
    by_flag = check_exposure("0.0.0.0", ORIGINS, behind_tls_proxy=True)
    by_env = check_exposure(
        "0.0.0.0", {**ORIGINS, "PLATFORM_CONSOLE_BEHIND_TLS_PROXY": "yes"}, behind_tls_proxy=False
    )
    for exposure in (by_flag, by_env):
        assert exposure.beyond_loopback and exposure.behind_tls_proxy and exposure.secure_cookies
        assert exposure.trusted_origins == ("https://ops.example.com",)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({}, "PLATFORM_CONSOLE_CSRF_TRUSTED_ORIGINS: must name the https://"),
        (
            {"PLATFORM_CONSOLE_CSRF_TRUSTED_ORIGINS": "http://ops.example.com"},
            "must be https:// (got http://ops.example.com)",
        ),
        ({**ORIGINS, "PLATFORM_CONSOLE_SECURE_COOKIES": "0"}, "PLATFORM_CONSOLE_SECURE_COOKIES"),
    ],
)
def test_the_proxy_needs_https_origins_and_secure_cookies(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named.replace("(", r"\(").replace(")", r"\)")):
        check_exposure("0.0.0.0", env, behind_tls_proxy=True)


def test_a_bad_boolean_names_its_variable() -> None:
    assert flag({"X": "On"}, "X") is True and flag({"X": ""}, "X") is None
    with pytest.raises(SettingsError, match="PLATFORM_CONSOLE_SECURE_COOKIES"):
        check_exposure(
            "127.0.0.1", {"PLATFORM_CONSOLE_SECURE_COOKIES": "maybe"}, behind_tls_proxy=False
        )
