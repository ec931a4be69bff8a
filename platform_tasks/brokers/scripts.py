"""Lua scripts shipped as ``.lua`` files in the package, loaded by name.

redis-py's ``Script`` objects run by SHA and reload transparently after a Redis restart
(NOSCRIPT), so callers never see script cache misses.

Redis runs a script as one source text, so scripts that share functions (the fair
transport's lane upkeep) name a part with a line ``-- include: <name>``, replaced here
by ``platform_tasks/lua/<name>.lua`` before the script is loaded.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_INCLUDE = re.compile(r"^-- include: ([a-z0-9_]+)$", re.MULTILINE)


@cache
def script_source(name: str) -> str:
    """Source of ``platform_tasks/lua/<name>.lua``, its ``-- include:`` lines expanded."""
    text = (resources.files("platform_tasks") / "lua" / f"{name}.lua").read_text()
    return _INCLUDE.sub(lambda match: script_source(match.group(1)), text)
