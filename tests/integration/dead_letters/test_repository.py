"""The dead-letter repository against the real PostgreSQL."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from psycopg2.extensions import connection as Connection

from platform_tasks import QueuePort, create_app
from platform_tasks.dead_letters.batch import Group
from platform_tasks.dead_letters.dead_letter import DeadLetter, insert_dead_letter
from platform_tasks.dead_letters.store import (
    DeadLetterFilter,
    discard_dead_letters,
    get_dead_letter,
    list_dead_letters,
    replay_dead_letters,
)
from platform_tasks.errors import ReplayError
from platform_tasks.observability.trace_context import CARRIED_HEADER
from platform_tasks.settings import PlatformSettings
from tests.integration.dead_letters.conftest import AddRow, envelope, poison_payload


def test_insert_returns_id_and_stores_every_field(conn: Connection) -> None:
    payload = envelope(kind="billing.charge_invoice", tenant="acme")
    job_id = uuid.UUID(payload["job_id"])
    with conn, conn.cursor() as cur:
        row_id = insert_dead_letter(
            cur,
            job_id=job_id,
            queue="billing",
            kind="billing.charge_invoice",
            tenant_id="acme",
            payload=payload,
            attempts=5,
            last_error="ValueError: bad\nTraceback",
            error_type="ValueError",
            reason="retries_exhausted",
            correlation_id=payload["correlation_id"],
        )
    assert isinstance(row_id, int)
    with conn.cursor() as cur:
        row = get_dead_letter(cur, row_id)
    assert row is not None
    assert row.job_id == job_id
    assert (row.queue, row.kind, row.tenant_id) == ("billing", "billing.charge_invoice", "acme")
    assert row.payload == payload
    assert (row.attempts, row.error_type, row.reason) == (5, "ValueError", "retries_exhausted")
    assert row.status == "pending_review"
    assert row.replay_count == 0 and row.replayed_at is None
    assert row.to_json()["job_id"] == str(job_id)


def test_a_written_dead_letter_reads_back_as_itself_with_the_stored_fields(
    conn: Connection,
) -> None:
    payload = envelope(kind="billing.charge_invoice", tenant="acme")
    written = DeadLetter(
        job_id=uuid.UUID(payload["job_id"]),
        queue="billing",
        kind="billing.charge_invoice",
        tenant_id="acme",
        correlation_id=payload["correlation_id"],
        payload=payload,
        attempts=5,
        last_error="ValueError: bad\nTraceback",
        error_type="ValueError",
        reason="retries_exhausted",
        headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    )
    assert (written.id, written.status, written.created_at) == (None, "pending_review", None)
    with conn, conn.cursor() as cur:
        row_id = written.write(cur)
    with conn.cursor() as cur:
        row = get_dead_letter(cur, row_id)
        summary = list_dead_letters(cur, with_payload=False)[0]
    assert row is not None and row.id == row_id
    assert row.created_at is not None and row.updated_at is not None
    assert replace(row, id=None, created_at=None, updated_at=None) == written
    assert (summary.id, summary.headers, summary.payload) == (row_id, written.headers, None)


def test_insert_is_part_of_the_callers_transaction(conn: Connection) -> None:
    with conn.cursor() as cur:
        row_id = insert_dead_letter(
            cur,
            job_id=None,
            queue=None,
            kind=None,
            tenant_id=None,
            payload=poison_payload(),
            attempts=1,
            last_error="not JSON",
            error_type=None,
            reason="poison",
            correlation_id=None,
        )
    conn.rollback()
    with conn.cursor() as cur:
        assert get_dead_letter(cur, row_id) is None


def test_list_filters_combine_and_newest_come_first(conn: Connection, add_row: AddRow) -> None:
    a = add_row(queue="billing", kind="billing.charge", tenant_id="acme")
    b = add_row(queue="billing", kind="billing.refund", tenant_id="acme")
    c = add_row(queue="mail", kind="mail.send", tenant_id="other")
    with conn.cursor() as cur:
        assert [r.id for r in list_dead_letters(cur)] == [c, b, a]
        assert [r.id for r in list_dead_letters(cur, DeadLetterFilter(queue="billing"))] == [b, a]
        only = DeadLetterFilter(queue="billing", kind="billing.refund", tenant_id="acme")
        assert [r.id for r in list_dead_letters(cur, only)] == [b]
        assert list_dead_letters(cur, DeadLetterFilter(status="replayed")) == []
        assert [r.id for r in list_dead_letters(cur, limit=1)] == [c]
        cur.execute(
            "UPDATE core.dead_letters SET created_at = now() - interval '3 days' WHERE id = %s",
            (a,),
        )
        since = datetime.now(UTC) - timedelta(days=1)
        assert [r.id for r in list_dead_letters(cur, DeadLetterFilter(since=since))] == [c, b]


class Recorder:
    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail_on = fail_on

    def __call__(self, queue: str, payload: Any) -> uuid.UUID:
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise ConnectionError("broker down")
        self.calls.append((queue, dict(payload)))
        return uuid.UUID(payload["job_id"])


def test_replay_publishes_original_envelope_and_marks_row(
    conn: Connection, add_row: AddRow
) -> None:
    payload = envelope()
    row_id = add_row(payload=payload, queue="billing")
    publish = Recorder()
    now = datetime(2030, 1, 2, tzinfo=UTC)
    report = replay_dead_letters(conn, publish, ids=[row_id], now=now)
    assert publish.calls == [("billing", payload)]
    assert [(r.id, str(r.job_id), r.queue) for r in report.replayed] == [
        (row_id, payload["job_id"], "billing")
    ]
    with conn.cursor() as cur:
        row = get_dead_letter(cur, row_id)
    assert row is not None
    assert (row.status, row.replay_count, row.replayed_at) == ("replayed", 1, now)
    again = replay_dead_letters(conn, publish, ids=[row_id])
    assert again.replayed == [] and again.not_pending == [(row_id, "replayed")]
    assert len(publish.calls) == 1


def test_dry_run_changes_nothing(conn: Connection, add_row: AddRow) -> None:
    row_id = add_row()
    publish = Recorder()
    report = replay_dead_letters(
        conn, publish, where=DeadLetterFilter(queue="default"), dry_run=True
    )
    assert [r.id for r in report.replayed] == [row_id]
    assert publish.calls == []
    with conn.cursor() as cur:
        row = get_dead_letter(cur, row_id)
    assert row is not None and row.status == "pending_review" and row.replay_count == 0


def test_raw_poison_rows_are_refused(conn: Connection, add_row: AddRow) -> None:
    poison = add_row(payload=poison_payload(), job_id=None, kind=None)
    invalid = add_row(payload={"job_id": "nope", "kind": "x"}, job_id=None)
    good = add_row()
    publish = Recorder()
    report = replay_dead_letters(conn, publish, ids=[poison, invalid, good, 999_999])
    assert [r.id for r in report.replayed] == [good]
    refused = dict(report.refused)
    assert "raw message" in refused[poison]
    assert "not a readable envelope" in refused[invalid]
    assert report.not_pending == [(999_999, "not found")]
    with conn.cursor() as cur:
        statuses = {i: get_dead_letter(cur, i).status for i in (poison, invalid)}  # type: ignore[union-attr]
    assert statuses == {poison: "pending_review", invalid: "pending_review"}


def test_publish_failure_keeps_the_failed_row_pending(conn: Connection, add_row: AddRow) -> None:
    ids = [add_row() for _ in range(3)]
    publish = Recorder(fail_on=1)
    with pytest.raises(ReplayError) as caught:
        replay_dead_letters(conn, publish, ids=ids)
    assert caught.value.dead_letter_id == ids[1]
    assert caught.value.replayed == [ids[0]]
    with conn.cursor() as cur:
        statuses = [get_dead_letter(cur, i).status for i in ids]  # type: ignore[union-attr]
    assert statuses == ["replayed", "pending_review", "pending_review"]


def test_replay_walks_every_batch(conn: Connection, add_row: AddRow) -> None:
    ids = [add_row() for _ in range(7)]
    publish = Recorder()
    report = replay_dead_letters(
        conn, publish, where=DeadLetterFilter(queue="default"), batch_size=3
    )
    assert [r.id for r in report.replayed] == ids
    assert len(publish.calls) == 7


def test_discard_records_reason_and_skips_non_pending(conn: Connection, add_row: AddRow) -> None:
    a, b = add_row(), add_row()
    now = datetime(2030, 1, 1, tzinfo=UTC)
    report = discard_dead_letters(conn, [a], reason="customer deleted", now=now)
    assert report.discarded == [a]
    assert report.groups == {Group("default", "tests.record", "RuntimeError")}
    again = discard_dead_letters(conn, [a, b, 424242], reason="cleanup")
    assert again.discarded == [b]
    assert again.not_pending == [(a, "discarded"), (424242, "not found")]
    with conn.cursor() as cur:
        row = get_dead_letter(cur, a)
    assert row is not None
    assert (row.status, row.discard_reason, row.discarded_at) == (
        "discarded",
        "customer deleted",
        now,
    )
    with pytest.raises(ValueError):
        discard_dead_letters(conn, [b], reason="  ")


def test_a_replay_drops_stored_headers_that_would_replace_celerys_own(
    conn: Connection, add_row: AddRow, settings: PlatformSettings, redis_client: redis.Redis
) -> None:
    """A row stored before such names were refused may hold one among its headers; the
    replayed message keeps the job's own id and protocol fields, and the custom rest."""
    payload = envelope()
    row_id = add_row(
        payload=payload, queue="billing", headers={"id": "evil", "retries": 9, "x-a": "1"}
    )
    app = create_app("dead_letters_replay_headers", settings=settings)
    port = QueuePort(app)
    try:
        report = replay_dead_letters(conn, port.publish, ids=[row_id])
    finally:
        port.close()
        app.close()
    assert [str(r.job_id) for r in report.replayed] == [payload["job_id"]]
    (raw,) = redis_client.lrange("billing", 0, -1)
    headers = json.loads(raw)["headers"]
    assert (headers["id"], headers["retries"], headers["x-a"]) == (payload["job_id"], 0, "1")
    assert headers[CARRIED_HEADER] == ["x-a"]
