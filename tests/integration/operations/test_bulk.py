"""Bulk discard, preview and refusals of the operations library on real PostgreSQL."""

from __future__ import annotations

from typing import Any

import psycopg2
import pytest
from psycopg2.extras import Json

from platform_tasks.operations import (
    OperationFilter,
    bulk_discard,
    bulk_replay,
    list_operations,
    preview_dead_letters,
)
from platform_tasks.settings import PlatformSettings
from tests.support.operations import add_dead_letters


def _statuses(url: str) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT tenant_id, error_type, status, discard_reason, count(*) "
                "FROM core.dead_letters GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3"
            )
            return list(cur.fetchall())
    finally:
        conn.close()


def test_bulk_discard_by_tenant_and_error_type_is_one_logged_operation(
    settings: PlatformSettings, database_url: str
) -> None:
    add_dead_letters(database_url, 1200, tenant="acme", error_type="Timeout")
    add_dead_letters(database_url, 30, tenant="acme", error_type="Other")
    add_dead_letters(database_url, 20, tenant="else", error_type="Timeout")
    where = OperationFilter(tenant_id="acme", error_type="Timeout")

    preview = preview_dead_letters(settings, where, sample_size=3)
    assert preview.matched == 1200
    assert [row.tenant_id for row in preview.sample] == ["acme"] * 3
    assert all(row.payload is None for row in preview.sample)  # no payload in a preview

    result = bulk_discard(settings, where, reason="customer left", actor="ana", batch_size=500)
    op = result.operation
    assert (op.kind, op.actor, op.outcome, op.matched, op.done, op.failed) == (
        "discard",
        "ana",
        "succeeded",
        1200,
        1200,
        0,
    )
    assert op.filter == where.to_json() and op.finished_at is not None
    assert _statuses(database_url) == [
        ("acme", "Other", "pending_review", None, 30),
        ("acme", "Timeout", "discarded", f"customer left (operation {op.id})", 1200),
        ("else", "Timeout", "pending_review", None, 20),
    ]
    again = bulk_discard(settings, where, reason="again", actor="ana")
    assert (again.resumed, again.operation.matched, again.operation.done) == (False, 0, 0)
    assert [o.id for o in list_operations(settings)] == [again.operation.id, op.id]


def test_empty_filter_is_refused_unless_asked_for(settings: PlatformSettings) -> None:
    with pytest.raises(ValueError, match="empty filter"):
        bulk_discard(settings, OperationFilter(), reason="x")
    assert list_operations(settings) == []


def test_unreplayable_rows_stay_pending_and_count_as_failed(
    settings: PlatformSettings, database_url: str
) -> None:
    add_dead_letters(database_url, 5, tenant="acme")
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "INSERT INTO core.dead_letters (queue, kind, tenant_id, payload, reason) "
                "VALUES ('default', 'tests.ops.apply', 'acme', %s, 'poison')",
                (Json({"raw": "not json {", "content_type": "application/json"}),),
            )
    finally:
        conn.close()
    published: list[str] = []

    def publish(queue: str, envelope: Any) -> str:
        published.append(envelope["job_id"])
        return str(envelope["job_id"])

    result = bulk_replay(settings, OperationFilter(tenant_id="acme"), actor="ana", publish=publish)
    op = result.operation
    assert (op.outcome, op.matched, op.done, op.failed) == ("partial", 6, 5, 1)
    assert len(published) == 5 and len(result.refused) == 1
    assert "not a readable envelope" in result.refused[0][1]
