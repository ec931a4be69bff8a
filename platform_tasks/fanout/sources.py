"""Where a fan-out's tenants come from: ``core.tenants`` or ``PLATFORM_TENANTS_QUERY``.

Tenants are streamed with a server-side (named) cursor in ``tenant_id`` order, so a
fan-out's memory does not grow with the number of tenants and a resumed fan-out can
start right after the last tenant it published. The product's own query replaces the
default source; it is checked once at start-up (a ``LIMIT 0`` run that must return the
columns ``tenant_id`` and ``freshness_tier``), so a typo fails the worker, not the first
fan-out at 03:00.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.errors

from platform_tasks.errors import ConfigurationError
from platform_tasks.postgres.queries import load_queries
from platform_tasks.settings.tenants_query import SETTING, single_statement

__all__ = ["REQUIRED_COLUMNS", "Tenant", "TenantSource", "check_tenants_query"]

REQUIRED_COLUMNS = ("tenant_id", "freshness_tier")


@dataclass(frozen=True, slots=True)
class Tenant:
    tenant_id: str
    freshness_tier: str


def _source_sql(query: str | None) -> str:
    """The tenants query as a subquery: the product's own, else the default source.

    The product's query is checked here, at every use, to be exactly one statement
    (:func:`~platform_tasks.settings.tenants_query.single_statement`).
    """
    if not query:
        return load_queries("fanout")["default_tenants"].strip()
    try:
        return single_statement(query)
    except ValueError as exc:
        raise ConfigurationError(f"{SETTING}: {exc}") from None


def _refused(exc: psycopg2.Error) -> ConfigurationError:
    """The product's query was refused by PostgreSQL (a write in the read-only transaction,
    a syntax error, a missing table): an error naming the setting, the cause chained."""
    error = ConfigurationError(f"{SETTING}: the query failed: {_first_line(exc)}")
    error.__cause__ = exc
    return error


_REFUSALS: tuple[type[psycopg2.Error], ...] = (
    psycopg2.errors.ReadOnlySqlTransaction,
    psycopg2.ProgrammingError,
    psycopg2.NotSupportedError,
)
"""What PostgreSQL answers a query it will not run (not an outage, not the query's own
``RAISE``): a write in the read-only transaction, bad SQL, a missing relation."""


def _escape_percent(sql: str) -> str:
    # psycopg2 formats parameters with %: a literal % in the user's query must survive.
    return sql.replace("%", "%%")


def check_tenants_query(database_url: str, query: str | None) -> None:
    """Raise :class:`ConfigurationError` naming the setting unless ``query`` returns
    ``tenant_id, freshness_tier`` (checked with ``LIMIT 0``: no rows are read)."""
    origin = SETTING if query else "the default tenant source (core.tenants)"
    sql = load_queries("fanout")["check_tenants"].format(source=_source_sql(query))
    try:
        conn = psycopg2.connect(database_url, connect_timeout=10)
    except psycopg2.OperationalError as exc:
        raise ConfigurationError(
            f"{origin}: cannot connect to PLATFORM_DATABASE_URL to check it: {_first_line(exc)}"
        ) from None
    try:
        conn.set_session(readonly=True)
        with conn.cursor() as cur:
            try:
                cur.execute(sql)
            except psycopg2.Error as exc:
                hint = " (run `platform-tasks migrate`)" if not query else ""
                raise ConfigurationError(
                    f"{origin}: the query failed: {_first_line(exc)}{hint}"
                ) from None
            columns = [column.name for column in cur.description or ()]
    finally:
        conn.close()
    missing = [name for name in REQUIRED_COLUMNS if name not in columns]
    if missing:
        raise ConfigurationError(
            f"{origin}: must return the columns {', '.join(REQUIRED_COLUMNS)}; "
            f"missing {', '.join(missing)} (it returns: {', '.join(columns) or 'no columns'})"
        )


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class TenantSource:
    """Streams ``(tenant_id, freshness_tier)`` in ``tenant_id`` order from PostgreSQL."""

    def __init__(self, database_url: str, query: str | None = None) -> None:
        self.database_url = database_url
        self.query = query

    def statement(self) -> str:
        """The streaming statement; parameters: the tenant to start after (``''``: all)
        and the tier names to keep (``None``: all), given twice."""
        source = _escape_percent(_source_sql(self.query))
        return load_queries("fanout")["stream_tenants"].format(source=source)

    def stream(
        self, *, after: str | None, tiers: Sequence[str] | None, batch_size: int
    ) -> Iterator[list[Tenant]]:
        """Batches of at most ``batch_size`` tenants after ``after`` (exclusive).

        One connection and one read-only transaction per stream; the named cursor keeps
        at most one batch in this process.
        """
        statement = self.statement()  # refuses more than one statement, before connecting
        conn = psycopg2.connect(self.database_url, connect_timeout=10)
        try:
            conn.set_session(readonly=True)
            keep = list(tiers) if tiers is not None else None
            params: list[Any] = [after or "", keep, keep]
            with conn.cursor(name="platform_fanout_tenants") as cur:
                cur.itersize = batch_size
                try:
                    cur.execute(statement, params)
                    while True:
                        rows = cur.fetchmany(batch_size)
                        if not rows:
                            return
                        yield [Tenant(tenant_id, tier) for tenant_id, tier in rows]
                except _REFUSALS as exc:
                    if not self.query:
                        raise
                    raise _refused(exc) from exc
        finally:
            conn.close()
