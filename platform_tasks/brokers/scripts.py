"""Lua scripts shipped as ``.lua`` files in the package, loaded by name.

redis-py's ``Script`` objects run by SHA and reload transparently after a Redis restart
(NOSCRIPT), so callers never see script cache misses.
"""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def script_source(name: str) -> str:
    """Source of ``platform_tasks/lua/<name>.lua``."""
    return (resources.files("platform_tasks") / "lua" / f"{name}.lua").read_text()
