"""The rule for a provider's base URL: https://, or plain http:// only over loopback.

Every request to the provider carries the API key (``Authorization: Bearer``) and the
recipients' addresses. Over plain http:// they cross the network in clear text, so
http:// is accepted only for a host that never leaves the machine: ``localhost``, an
address in 127.0.0.0/8, or ``::1`` (a local stand-in of the provider, as the tests and a
development setup use). Anything else must be https://.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

__all__ = ["check_base_url", "is_loopback_host"]


def is_loopback_host(host: str) -> bool:
    """``localhost``, an IPv4 address in 127.0.0.0/8, or ``::1``."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_base_url(url: str) -> str:
    """``url`` without a trailing slash; ``ValueError`` saying why it is refused.

    The message names the host, never the whole URL (a URL with credentials is refused
    before it could be printed).
    """
    if "@" in url:
        raise ValueError("must be an http(s):// URL without credentials")
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 - a malformed port raises here
    except ValueError as exc:
        raise ValueError(f"must be an http(s):// URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http") or not host:
        raise ValueError("must be an http(s):// URL with a host")
    if scheme == "http" and not is_loopback_host(host):
        raise ValueError(
            f"plain http:// is accepted only for a loopback host (127.0.0.0/8, ::1, "
            f"localhost), got host {host!r}: the API key would cross the network in clear "
            "text; use https://"
        )
    return url.rstrip("/")
