"""``fan_out(..., on_complete=)`` against real Redis and PostgreSQL (the consumer run in this
process, in a transaction of the test's): the tenants' jobs join the fan-out's batch and
carry its header, the batch stays open while the fan-out job itself has not ended, and
``on_complete`` is put in the outbox once, by the transaction of the last ending."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import UTC, datetime

import psycopg2
import pytest
import redis

from platform_tasks.batches import Callback
from platform_tasks.batches.endings import count_ending
from platform_tasks.fanout import fan_out, tenant_job_id
from platform_tasks.fanout.consumer import run_fan_out
from platform_tasks.headers import BATCH_HEADER
from platform_tasks.jobs.runner import JobContext

from .conftest import FanOutHarness, add_tenants, decode

POINT = datetime(2025, 5, 6, 3, 0, tzinfo=UTC)
DONE = Callback(queue="reports", kind="reports.all_done", tenant_id="ops", data={"n": 1})


def ctx() -> JobContext:
    return JobContext(
        name="maintenance.done",
        scheduled_for=POINT,
        cancel_requested=threading.Event(),
        logger=logging.getLogger("test"),
    )


def _rows(database_url: str, statement: str, params: tuple[object, ...] = ()) -> list[tuple]:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement, params or None)
            return cur.fetchall()
    finally:
        conn.close()


def _callbacks(database_url: str) -> int:
    return int(
        _rows(database_url, "SELECT count(*) FROM core.outbox WHERE queue = 'reports'")[0][0]
    )


def _run_in_transaction(harness: FanOutHarness, database_url: str) -> None:
    """One delivery of the pending fan-out, its own ending counted in a transaction that
    commits (as the consumer pipeline commits the fan-out job's)."""
    [envelope] = harness.pending_fan_outs()
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            run_fan_out(harness.app, envelope, settings=harness.settings, tx=cur)
    finally:
        conn.close()


def _end(database_url: str, harness: FanOutHarness, job_id: uuid.UUID) -> None:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            count_ending(cur, job_id, "applied", lambda: harness.port)
    finally:
        conn.close()


def test_on_complete_fires_once_after_the_fan_out_and_every_tenant_job_ended(
    harness: FanOutHarness, database_url: str, redis_client: redis.Redis
) -> None:
    add_tenants(database_url, [("acme", "1h"), ("globex", "1h"), ("initech", "1h")])
    settings = harness.settings.model_copy(update={"fanout_batch_size": 1})  # a page each
    harness.settings = settings
    fan_id = fan_out(ctx(), queue="work", kind="demo.recompute", on_complete=DONE)
    _run_in_transaction(harness, database_url)

    messages = [decode(raw)[0] for raw in reversed(redis_client.lrange("work", 0, -1))]
    assert [m["headers"][BATCH_HEADER] for m in messages] == [str(fan_id)] * 3
    children = _rows(
        database_url,
        "SELECT job_id::text, tenant_id, kind, outcome FROM core.batch_jobs WHERE batch_id = %s"
        " ORDER BY tenant_id",
        (str(fan_id),),
    )
    tenants = ["acme", "globex", "initech"]
    jobs = [tenant_job_id("maintenance.done", POINT, "demo.recompute", t) for t in tenants]
    assert children == [
        *((str(j), t, "demo.recompute", None) for j, t in zip(jobs, tenants, strict=True)),
        (str(fan_id), "platform", "platform.fanout", "applied"),
    ]
    [(description,)] = _rows(
        database_url, "SELECT description FROM core.batches WHERE batch_id = %s", (str(fan_id),)
    )
    assert description == (
        "fan-out of maintenance.done at 2025-05-06T03:00:00+00:00 to demo.recompute"
    )

    for job_id in jobs[:2]:
        _end(database_url, harness, job_id)
        assert _callbacks(database_url) == 0
    _end(database_url, harness, jobs[2])
    assert _callbacks(database_url) == 1
    _end(database_url, harness, jobs[2])  # a duplicate ending counts nothing
    assert _callbacks(database_url) == 1

    # a redelivered fan-out (finished already) counts its ending again: nothing more
    fan_out(ctx(), queue="work", kind="demo.recompute", on_complete=DONE)
    _run_in_transaction(harness, database_url)
    assert _callbacks(database_url) == 1
    assert _rows(
        database_url,
        "SELECT complete_fired_at IS NOT NULL FROM core.batches WHERE batch_id = %s",
        (str(fan_id),),
    ) == [(True,)]


def test_a_fan_out_of_no_tenant_completes_at_its_own_end(
    harness: FanOutHarness, database_url: str
) -> None:
    fan_id = fan_out(ctx(), queue="work", kind="demo.recompute", on_complete=DONE)
    _run_in_transaction(harness, database_url)
    assert _callbacks(database_url) == 1
    assert _rows(
        database_url, "SELECT count(*) FROM core.batch_jobs WHERE batch_id = %s", (str(fan_id),)
    ) == [(1,)]


def test_a_fan_out_without_on_complete_is_no_batch_and_a_bad_callback_is_refused(
    harness: FanOutHarness, database_url: str, redis_client: redis.Redis
) -> None:
    add_tenants(database_url, [("acme", "1h")])
    fan_out(ctx(), queue="work", kind="demo.recompute")
    _run_in_transaction(harness, database_url)
    assert _rows(database_url, "SELECT count(*) FROM core.batches") == [(0,)]
    [raw] = redis_client.lrange("work", 0, -1)
    assert BATCH_HEADER not in decode(raw)[0]["headers"]
    with pytest.raises(ValueError, match=r"on_complete\.queue must be a non-empty"):
        fan_out(
            ctx(),
            queue="work",
            kind="demo.recompute",
            on_complete={"queue": "", "kind": "a.b", "tenant_id": "ops"},
        )
