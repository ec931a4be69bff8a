"""The host names a console bound to a given address answers to (no Django import, so
the command can compute them before Django is set up)."""

from __future__ import annotations

__all__ = ["LOOPBACK_HOSTS", "with_host"]

LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]", "::1"]


def with_host(host: str) -> list[str]:
    """The loopback names plus ``host`` (an IPv6 address also in brackets)."""
    names = list(LOOPBACK_HOSTS)
    bare = host.strip("[]")
    for name in (bare, f"[{bare}]" if ":" in bare else bare):
        if name not in names:
            names.append(name)
    return names
