"""Where the standalone console may listen, and what listening beyond loopback requires.

The console speaks plain HTTP (waitress, no TLS). On loopback that is fine: only the
machine itself reaches it. Bound to any other address, passwords and session cookies
would cross the network in clear text, so ``platform-tasks console`` refuses to start
there unless the operator says a TLS-terminating proxy sits in front
(``--behind-tls-proxy`` / ``PLATFORM_CONSOLE_BEHIND_TLS_PROXY=1``). With that said:

* the session and CSRF cookies are ``Secure`` (a browser sends them over HTTPS only);
  ``PLATFORM_CONSOLE_SECURE_COOKIES=0`` beside it is a contradiction and refused;
* ``PLATFORM_CONSOLE_CSRF_TRUSTED_ORIGINS`` must name the ``https://`` origin(s) the proxy
  serves (the browser's POSTs carry that origin; without it every login fails CSRF), and
  their host names join the allowed hosts;
* the start logs ``console.plain_http_beyond_loopback``: the port itself must be
  reachable by the proxy only.

Pure functions of the host and the environment, used before Django is set up.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from platform_tasks.errors import SettingsError

__all__ = [
    "BEHIND_TLS_PROXY_ENV",
    "SECURE_COOKIES_ENV",
    "TRUSTED_ORIGINS_ENV",
    "Exposure",
    "check_exposure",
    "flag",
    "is_loopback",
    "origin_hosts",
]

BEHIND_TLS_PROXY_ENV = "PLATFORM_CONSOLE_BEHIND_TLS_PROXY"
SECURE_COOKIES_ENV = "PLATFORM_CONSOLE_SECURE_COOKIES"
TRUSTED_ORIGINS_ENV = "PLATFORM_CONSOLE_CSRF_TRUSTED_ORIGINS"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def flag(env: Mapping[str, str], name: str) -> bool | None:
    """A boolean variable: ``None`` when unset or empty; a bad value names the variable."""
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return None
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise SettingsError([(name, f"must be 1/true/yes/on or 0/false/no/off (got {raw!r})")])


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (``127.0.0.0/8``, ``::1``); a wildcard
    (``0.0.0.0``, ``::``) or any other name or address is beyond loopback."""
    bare = host.strip().strip("[]")
    if bare.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def _origins(env: Mapping[str, str]) -> list[str]:
    return [
        item.strip() for item in (env.get(TRUSTED_ORIGINS_ENV) or "").split(",") if item.strip()
    ]


def origin_hosts(origins: list[str]) -> list[str]:
    """The host names of ``https://name[:port]`` origins (for the allowed hosts)."""
    return [host for host in (urlsplit(origin).hostname for origin in origins) if host]


@dataclass(frozen=True)
class Exposure:
    """What the console serves with, decided once at start."""

    beyond_loopback: bool
    behind_tls_proxy: bool
    secure_cookies: bool
    trusted_origins: tuple[str, ...]


def check_exposure(host: str, env: Mapping[str, str], *, behind_tls_proxy: bool) -> Exposure:
    """The console's exposure for ``--host host``, or a :class:`SettingsError` naming
    every flag and variable that has to change (see the module's docstring)."""
    proxy = behind_tls_proxy or bool(flag(env, BEHIND_TLS_PROXY_ENV))
    secure = flag(env, SECURE_COOKIES_ENV)
    origins = _origins(env)
    beyond = not is_loopback(host)
    problems: list[tuple[str, str]] = []
    if beyond and not proxy:
        problems.append(
            (
                "--host",
                f"{host} is beyond loopback, and the console serves plain HTTP (passwords "
                "and session cookies in clear text): put a TLS-terminating proxy in front "
                f"and say so with --behind-tls-proxy (or {BEHIND_TLS_PROXY_ENV}=1), or "
                "listen on 127.0.0.1",
            )
        )
    if proxy:
        if secure is False:
            problems.append(
                (
                    SECURE_COOKIES_ENV,
                    "is off, but behind a TLS proxy the session and CSRF cookies must be "
                    "Secure: unset it",
                )
            )
        if not origins:
            problems.append(
                (
                    TRUSTED_ORIGINS_ENV,
                    "must name the https:// origin(s) the proxy serves the console at "
                    "(e.g. https://ops.example.com): the browser's POSTs carry it, and "
                    "without it every login fails the CSRF check",
                )
            )
        plain = [origin for origin in origins if not origin.lower().startswith("https://")]
        if plain:
            problems.append(
                (
                    TRUSTED_ORIGINS_ENV,
                    f"behind a TLS proxy must be https:// (got {', '.join(plain)})",
                )
            )
    if problems:
        raise SettingsError(problems)
    return Exposure(
        beyond_loopback=beyond,
        behind_tls_proxy=proxy,
        secure_cookies=proxy or bool(secure),
        trusted_origins=tuple(origins),
    )
