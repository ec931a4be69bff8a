"""Bulk discard, preview and refusals of the operations library on real PostgreSQL."""

from __future__ import annotations

import threading
from typing import Any

import psycopg2
import pytest
from psycopg2.extras import Json

from platform_tasks.app import platform_queue_port
from platform_tasks.dead_letters.batch import Group
from platform_tasks.dead_letters.store import replay_dead_letters
from platform_tasks.operations import (
    OperationFilter,
    bulk_discard,
    bulk_replay,
    list_operations,
    preview_dead_letters,
)
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.support.operations import (
    REPLAYED_HEADERS,
    STORED_HEADERS,
    add_dead_letters,
    replayed_headers,
)


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
    assert result.groups == {Group("default", "tests.ops.apply", "Timeout")}
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
    assert result.groups == {Group("default", "tests.ops.apply", "RuntimeError")}
    assert len(published) == 5 and len(result.refused) == 1
    assert "not a readable envelope" in result.refused[0][1]


def _row_held_until_rolled_back(database_url: str, job_id: str) -> Any:
    """A connection holding the row of ``job_id`` locked (as a replay by id does while it
    publishes); rolled back by the caller, which leaves the row pending."""
    holder = psycopg2.connect(database_url)
    with holder.cursor() as cur:
        cur.execute("SELECT id FROM core.dead_letters WHERE job_id = %s FOR UPDATE", (job_id,))
    return holder


def _lock_waiters(database_url: str) -> int:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            return int(cur.fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize("kind", ["discard", "replay"])
def test_rows_skipped_while_another_transaction_held_them_are_acted_on(
    settings: PlatformSettings, database_url: str, kind: str
) -> None:
    jobs = add_dead_letters(database_url, 12, tenant="held")
    holder = _row_held_until_rolled_back(database_url, jobs[5])
    published: list[str] = []
    outcome: dict[str, Any] = {}

    def run() -> None:
        where = OperationFilter(tenant_id="held")
        if kind == "discard":
            outcome["result"] = bulk_discard(settings, where, reason="r", batch_size=4)
        else:
            outcome["result"] = bulk_replay(
                settings,
                where,
                batch_size=4,
                publish=lambda queue, payload: (
                    published.append(payload["job_id"]) or payload["job_id"]
                ),
            )

    worker = threading.Thread(target=run)
    try:
        worker.start()
        # the operation either waits for the held row or (the defect) finishes without it
        wait_until(
            lambda: not worker.is_alive() or _lock_waiters(database_url) > 0,
            timeout=30,
            message="the operation to finish or to wait for the held row",
        )
    finally:
        holder.rollback()  # the holder gave up: the row is pending again
        holder.close()
    worker.join(timeout=30)
    assert not worker.is_alive()
    op = outcome["result"].operation
    assert (op.outcome, op.matched, op.done, op.failed) == ("succeeded", 12, 12, 0)
    pending = [row for row in _statuses(database_url) if row[2] == "pending_review"]
    assert pending == []
    if kind == "replay":
        assert sorted(published) == sorted(jobs)


def test_a_replay_by_filter_sends_the_stored_headers_as_a_replay_by_id_does(
    settings: PlatformSettings, database_url: str, redis_client: Any
) -> None:
    """What the console runs (``bulk_replay`` with the settings alone) and a replay by id
    send the same headers: the row's trace context and custom headers, without the
    stored publish time (a replay is a new publish) or a name Celery uses."""
    add_dead_letters(database_url, 1, queue="by_id", tenant="by-id", headers=STORED_HEADERS)
    add_dead_letters(database_url, 1, queue="by_filter", tenant="acme", headers=STORED_HEADERS)
    conn = psycopg2.connect(database_url)
    port = platform_queue_port(settings)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id FROM core.dead_letters WHERE tenant_id = 'by-id'")
            (by_id_row,) = cur.fetchone()
        by_id = replay_dead_letters(conn, port.publish, ids=[by_id_row])
    finally:
        port.close()
        conn.close()
    assert by_id.groups == {Group("by_id", "tests.ops.apply", "RuntimeError")}
    result = bulk_replay(settings, OperationFilter(tenant_id="acme"), actor="ana")
    assert (result.operation.outcome, result.operation.done) == ("succeeded", 1)
    assert result.groups == {Group("by_filter", "tests.ops.apply", "RuntimeError")}
    assert replayed_headers(redis_client, "by_id") == REPLAYED_HEADERS
    assert replayed_headers(redis_client, "by_filter") == REPLAYED_HEADERS
