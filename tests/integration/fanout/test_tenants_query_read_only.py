"""``PLATFORM_TENANTS_QUERY`` runs as exactly one read-only statement, on the real PostgreSQL.

Each query here would write to ``core.tenants`` if it ran as written; each must be refused
with an error naming the setting, at start-up (the settings, the worker's check) and at
use (the fan-out's stream), and the tenants must all still be there afterwards.
"""

from __future__ import annotations

import re

import psycopg2
import pytest

from platform_tasks.errors import ConfigurationError
from platform_tasks.fanout.sources import TenantSource, check_tenants_query
from platform_tasks.settings import PlatformSettings, SettingsError
from tests.integration.fanout.conftest import add_tenants

TWO_STATEMENTS = "select tenant_id, freshness_tier from core.tenants; delete from core.tenants"
# closes the template's subquery, ends the read-only transaction, makes the session
# read-write, deletes, and reopens a subquery for the rest of the template
ESCAPE = (
    "select tenant_id, freshness_tier from core.tenants) t; commit; "
    "set session characteristics as transaction read write; delete from core.tenants; "
    "select * from (select 1"
)
WRITING_CTE = (
    "with gone as (delete from core.tenants returning tenant_id, freshness_tier) "
    "select tenant_id, freshness_tier from gone"
)


def tenant_count(database_url: str) -> int:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM core.tenants")
            return int(cur.fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def tenants(database_url: str) -> str:
    add_tenants(database_url, [("t-1", "nightly"), ("t-2", "1h"), ("t-3", "6h")])
    return database_url


@pytest.mark.parametrize("query", [TWO_STATEMENTS, ESCAPE], ids=["two", "escape"])
def test_more_than_one_statement_is_refused_naming_the_setting(tenants: str, query: str) -> None:
    refused = r"^PLATFORM_TENANTS_QUERY: must be exactly one statement"
    with pytest.raises(ConfigurationError) as at_start:
        check_tenants_query(tenants, query)
    assert tenant_count(tenants) == 3  # the worker's start-up check deleted nothing
    assert re.match(refused, str(at_start.value)), str(at_start.value)
    with pytest.raises(ConfigurationError, match=refused):
        list(TenantSource(tenants, query).stream(after=None, tiers=None, batch_size=10))
    assert tenant_count(tenants) == 3
    with pytest.raises(SettingsError, match=r"PLATFORM_TENANTS_QUERY: .*must be exactly one"):
        PlatformSettings.from_env({"PLATFORM_TENANTS_QUERY": query})


def test_a_writing_cte_is_refused_and_deletes_nothing(tenants: str) -> None:
    """PostgreSQL refuses a data-modifying WITH below the top level, which is where the
    platform's templates put the query (a subquery)."""
    with pytest.raises(ConfigurationError) as at_start:
        check_tenants_query(tenants, WRITING_CTE)
    assert str(at_start.value).startswith("PLATFORM_TENANTS_QUERY: the query failed:")
    with pytest.raises(ConfigurationError) as at_use:
        list(TenantSource(tenants, WRITING_CTE).stream(after=None, tiers=None, batch_size=10))
    assert str(at_use.value).startswith("PLATFORM_TENANTS_QUERY: the query failed:")
    assert tenant_count(tenants) == 3


def test_a_single_statement_that_writes_is_refused_by_the_read_only_transaction(
    tenants: str,
) -> None:
    """A write hidden in a function that one SELECT
    calls, pass any parser: the read-only transaction the query runs in refuses it. (The
    start-up check reads no rows, ``LIMIT 0``, so it never calls the function.)"""
    conn = psycopg2.connect(tenants)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "CREATE OR REPLACE FUNCTION public.wipe_tenants() RETURNS boolean "
                "LANGUAGE sql AS $$ DELETE FROM core.tenants; SELECT true $$"
            )
    finally:
        conn.close()
    query = "select tenant_id, freshness_tier from core.tenants where public.wipe_tenants()"
    check_tenants_query(tenants, query)
    with pytest.raises(ConfigurationError) as at_use:
        list(TenantSource(tenants, query).stream(after=None, tiers=None, batch_size=10))
    assert str(at_use.value).startswith("PLATFORM_TENANTS_QUERY:")
    assert "read-only transaction" in str(at_use.value)
    assert tenant_count(tenants) == 3


def test_one_statement_with_semicolons_in_literals_and_comments_still_runs(tenants: str) -> None:
    query = (
        "select tenant_id, freshness_tier from core.tenants where tenant_id <> 'a;b' "
        "/* not; a statement */ order by tenant_id; -- trailing; comment"
    )
    assert PlatformSettings.from_env({"PLATFORM_TENANTS_QUERY": query}).tenants_query
    check_tenants_query(tenants, query)
    batches = list(TenantSource(tenants, query).stream(after=None, tiers=None, batch_size=10))
    assert [t.tenant_id for batch in batches for t in batch] == ["t-1", "t-2", "t-3"]
