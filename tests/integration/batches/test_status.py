"""The batches' read model against real PostgreSQL and Redis: counts by outcome and by
tenant, callbacks fired and when, pages of the list, and where outstanding children are
(a delayed child found in the real delay store, the rest waiting)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg2
import pytest
from psycopg2.extensions import connection as Connection

from platform_tasks import QueuePort, create_app
from platform_tasks.batches import status
from platform_tasks.batches.locator import WorkerAndDelayLocator
from platform_tasks.settings import PlatformSettings
from tests.support.batch_rows import Child, insert_batch

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
REPORT = {"queue": "reports", "kind": "reports.done", "tenant_id": "ops", "data": {}}


@pytest.fixture
def conn(database_url: str) -> Iterator[Connection]:
    connection = psycopg2.connect(database_url)
    yield connection
    connection.close()


def _children() -> list[Child]:
    ended = T0 + timedelta(minutes=5)
    return [
        *(Child("acme", "applied", ended) for _ in range(3)),
        Child("acme", "dead_lettered", ended),
        Child("globex", "discarded", ended),
        Child("globex", "cancelled", ended),
        *(Child("globex") for _ in range(2)),
        Child("initech"),
    ]


def test_show_counts_by_outcome_and_tenant_with_callbacks_fired_and_when(
    database_url: str, conn: Connection
) -> None:
    fired = T0 + timedelta(minutes=5, seconds=1)
    batch_id = insert_batch(
        database_url,
        _children(),
        description="March invoices",
        created_at=T0,
        on_complete=REPORT,
        on_death={**REPORT, "kind": "reports.failed"},
        death_fired_at=fired,
    )

    detail = status.show_batch(conn, batch_id)

    assert detail is not None
    summary = detail.summary
    assert summary.description == "March invoices"
    assert summary.created_at == T0
    assert summary.state == "open"
    assert summary.counts.to_json() == {
        "applied": 3,
        "dead_lettered": 1,
        "discarded": 1,
        "cancelled": 1,
        "outstanding": 3,
        "total": 9,
    }
    assert [(c.name, c.kind, c.queue, c.fired_at) for c in summary.callbacks] == [
        ("on_complete", "reports.done", "reports", None),
        ("on_success", None, None, None),
        ("on_death", "reports.failed", "reports", fired),
    ]
    assert detail.tenant_total == 3
    assert [(t.tenant_id, t.counts.to_json()) for t in detail.tenants] == [
        (
            "acme",
            {"applied": 3, "dead_lettered": 1, "discarded": 0, "cancelled": 0,
             "outstanding": 0, "total": 4},
        ),
        (
            "globex",
            {"applied": 0, "dead_lettered": 0, "discarded": 1, "cancelled": 1,
             "outstanding": 2, "total": 4},
        ),
        (
            "initech",
            {"applied": 0, "dead_lettered": 0, "discarded": 0, "cancelled": 0,
             "outstanding": 1, "total": 1},
        ),
    ]  # fmt: skip
    as_json = detail.to_json()
    assert as_json["callbacks"][2]["fired_at"] == fired.isoformat()
    assert as_json["places"] is None
    assert status.show_batch(conn, uuid.uuid4()) is None


def test_list_is_newest_first_pages_with_before_and_filters_open_batches(
    database_url: str, conn: Connection
) -> None:
    done_at = T0 + timedelta(minutes=1)
    older = insert_batch(
        database_url,
        [Child("acme", "applied", done_at)],
        created_at=T0,
        complete_fired_at=done_at,
        on_complete=REPORT,
    )
    newer = insert_batch(database_url, [Child("acme")], created_at=T0 + timedelta(hours=1))

    listed = status.list_batches(conn)
    assert [b.batch_id for b in listed] == [newer, older]
    assert [b.state for b in listed] == ["open", "complete"]
    assert listed[1].callback("on_complete").fired_at == done_at
    assert [b.batch_id for b in status.list_batches(conn, limit=1)] == [newer]
    page_two = status.list_batches(conn, before=listed[0].created_at)
    assert [b.batch_id for b in page_two] == [older]
    assert [b.batch_id for b in status.list_batches(conn, open_only=True)] == [newer]
    with pytest.raises(ValueError, match="limit"):
        status.list_batches(conn, limit=0)
    with pytest.raises(ValueError, match="'nope' is not a batch id"):
        status.parse_batch_id("nope")


def test_places_finds_a_delayed_child_in_the_delay_store_and_counts_dead_letters(
    settings: PlatformSettings, database_url: str, conn: Connection
) -> None:
    port = QueuePort(create_app("batch_places", settings=settings))
    try:
        delayed = port.schedule(
            "default",
            {"tenant_id": "acme", "kind": "reports.render", "data": {}},
            datetime.now(UTC) + timedelta(hours=1),
        )
        # another job in the store, not a child: not counted
        port.schedule(
            "default",
            {"tenant_id": "acme", "kind": "reports.render", "data": {}},
            datetime.now(UTC) + timedelta(hours=1),
        )
    finally:
        port.close()
    dead = Child("globex", "dead_lettered", T0)
    batch_id = insert_batch(
        database_url,
        [Child("acme", job_id=delayed), Child("acme"), Child("acme"), dead],
        created_at=T0,
    )
    with conn, conn.cursor() as cur:
        cur.execute(
            "INSERT INTO core.dead_letters (job_id, queue, kind, tenant_id, payload)"
            " VALUES (%s, 'default', 'reports.render', 'globex', '{}')",
            (str(dead.job_id),),
        )

    locator = WorkerAndDelayLocator(settings)  # no app: the workers are not asked
    detail = status.show_batch(conn, batch_id, locator=locator)

    assert detail is not None and detail.places is not None
    assert detail.places == status.Places(
        waiting=2, delayed=1, running=0, dead=1, unknown=("workers",), unlocated=0
    )
    assert detail.places.describe() == (
        "2 waiting, 1 delayed, 0 running, 1 dead (could not look in: workers)"
    )
