"""``PLATFORM_TENANTS_QUERY`` must be exactly one statement, which then runs read-only.

The query is pasted as a subquery into the platform's own statements and sent with
psycopg2, whose simple-query protocol runs every statement of a string: a query such as
``select …) t; commit; set session characteristics as transaction read write; delete …``
would end the read-only transaction and write. So the text is split with sqlparse
(semicolons inside literals, quoted names, dollar quotes and comments are not
separators) and anything but one statement is refused, when the settings are read
(start-up) and again each time the query is used. What the one statement does is then
left to PostgreSQL: it runs in a ``READ ONLY`` transaction, which refuses any write,
including one hidden in a function the query calls.
"""

from __future__ import annotations

import sqlparse
from sqlparse import tokens
from sqlparse.sql import Statement, Token

__all__ = ["SETTING", "single_statement"]

SETTING = "PLATFORM_TENANTS_QUERY"


def _tokens(statement: Statement) -> list[Token]:
    """The statement's leaf tokens (sqlparse's ``flatten`` carries no annotations)."""
    return list(statement.flatten())  # type: ignore[no-untyped-call]


def _has_code(statement: Statement) -> bool:
    return any(
        not (token.is_whitespace or token.ttype in tokens.Comment or token.value == ";")
        for token in _tokens(statement)
    )


def single_statement(query: str) -> str:
    """``query`` without its trailing semicolon; ``ValueError`` unless it is one statement.

    Statements made only of comments (a comment after the final ``;``) do not count.
    """
    statements = [statement for statement in sqlparse.parse(query) if _has_code(statement)]
    if len(statements) != 1:
        raise ValueError(
            f"must be exactly one statement (a SELECT returning tenant_id, freshness_tier); "
            f"got {len(statements)} separated by ';'"
        )
    parts = _tokens(statements[0])
    # the statement's own closing semicolons go; comments after them stay (harmless: the
    # platform's templates continue on a new line)
    while True:
        code = [
            n for n, t in enumerate(parts) if not (t.is_whitespace or t.ttype in tokens.Comment)
        ]
        if not code or parts[code[-1]].value != ";":
            break
        del parts[code[-1]]
    return "".join(token.value for token in parts).strip()
