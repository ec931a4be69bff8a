"""Named SQL queries kept in package data, loaded by name.

SQL lives in ``platform_tasks/sql/<file>.sql`` rather than in Python strings so it can be
read, reviewed and run by hand as SQL. Each query starts with a ``-- name: <query>`` line;
the comment lines after it say what the query is for.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """Split ``text`` into ``{name: sql}`` at each ``-- name:`` line."""
    queries: dict[str, str] = {}
    matches = list(_NAME.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        name = match[1]
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = text[match.end() : end].strip()
    return queries


@cache
def load_queries(filename: str) -> dict[str, str]:
    """The named queries of ``platform_tasks/sql/<filename>.sql``, read once per process."""
    text = (resources.files("platform_tasks") / "sql" / f"{filename}.sql").read_text()
    return parse_queries(text)
