"""One SQL statement against the test database, for tests that read what workers wrote."""

from __future__ import annotations

from typing import Any

import psycopg2


def query(
    database_url: str, sql: str, *params: Any, connect_timeout: int = 10
) -> list[tuple[Any, ...]]:
    """Run ``sql`` in its own committed transaction; the rows it returns, if any.

    A fresh connection each call, so a test never holds a transaction open across the
    workers it waits for; ``connect_timeout`` bounds a server that does not answer
    (a stopped or partitioned PostgreSQL) instead of hanging the test.
    """
    conn = psycopg2.connect(database_url, connect_timeout=connect_timeout)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()
