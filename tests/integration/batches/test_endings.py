"""Counting a batch's endings in real PostgreSQL: each child once, the callbacks in the
outbox exactly once, by the transaction that counts the last ending (no worker: the
endings are counted the way the consumer counts them, through platform_tasks.batches)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2
import psycopg2.errors
import pytest
from psycopg2.extensions import TRANSACTION_STATUS_IDLE, TRANSACTION_STATUS_INTRANS

from platform_tasks import QueuePort, create_app
from platform_tasks.batches import Callback
from platform_tasks.batches.children import RunningChild
from platform_tasks.batches.endings import count_applied, count_applied_with_commit, count_ending
from platform_tasks.batches.store import ChildRow
from platform_tasks.consumer.idempotency import claim, is_processed
from platform_tasks.dead_letters.dead_letter import DeadLetter
from platform_tasks.dead_letters.store import replay_dead_letters
from platform_tasks.envelope import uuid7
from platform_tasks.headers import BATCH_HEADER
from platform_tasks.postgres.queries import load_queries
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.apps.batch_app import CALLBACK, CHILD, QUEUE
from tests.support.database import query


@pytest.fixture
def port(redis_url: str, database_url: str) -> Iterator[QueuePort]:
    settings = PlatformSettings.build(
        redis_url=redis_url, broker_url=redis_url, database_url=database_url, profile="test"
    )
    app = create_app("batch_producer", settings=settings)
    made = QueuePort(app)
    try:
        yield made
    finally:
        made.close()
        app.close()


def callbacks_in_outbox(database_url: str) -> list[dict[str, Any]]:
    """The callback jobs waiting in core.outbox: their envelope data."""
    found = []
    for (message,) in query(database_url, "SELECT message FROM core.outbox ORDER BY id"):
        wire = json.loads(message)
        body = wire["body"]
        if wire["headers"]["task"] == CALLBACK:
            import base64

            found.append(json.loads(base64.b64decode(body))[0][0]["data"])
    return found


def cb(name: str) -> Callback:
    return Callback(QUEUE, CALLBACK, "t1", {"name": name})


def child(**data: Any) -> dict[str, Any]:
    return {"tenant_id": "t1", "kind": CHILD, "data": data}


def make_batch(port: QueuePort, database_url: str, n: int, shards: int = 4) -> list[uuid.UUID]:
    conn = psycopg2.connect(database_url)
    with (
        conn,
        conn.cursor() as cur,
        port.batch(
            on_complete=cb("complete"),
            on_success=cb("success"),
            on_death=cb("death"),
            description="test",
            shards=shards,
            tx=cur,
        ) as batch,
    ):
        jobs = [batch.publish(QUEUE, child(n=i)) for i in range(n)]
    conn.close()
    return [batch.id, *jobs]


def end(database_url: str, job: uuid.UUID, outcome: str, port: QueuePort) -> list[uuid.UUID]:
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            return count_ending(cur, job, outcome, lambda: port)
    finally:
        conn.close()


def test_children_count_once_and_each_callback_fires_once_replay_brings_success(
    port: QueuePort, database_url: str
) -> None:
    query(database_url, "TRUNCATE core.outbox, core.batches CASCADE")
    batch, *jobs = make_batch(port, database_url, 5)
    messages = [m for (m,) in query(database_url, "SELECT message FROM core.outbox")]
    assert len(messages) == 5
    assert all(json.loads(m)["headers"][BATCH_HEADER] == str(batch) for m in messages)
    query(database_url, "TRUNCATE core.outbox")

    query(database_url, "UPDATE core.batches SET progressed_at = now() - interval '1 hour'")
    assert end(database_url, jobs[0], "applied", port) == [batch]
    stale = "SELECT progressed_at < now() - interval '1 minute' FROM core.batches"
    assert query(database_url, stale)[0][0] is False, "an ending moves progressed_at"
    assert end(database_url, jobs[0], "applied", port) == [], "a duplicate counts nothing"
    assert end(database_url, jobs[1], "dead_lettered", port) == [batch]
    assert [c["name"] for c in callbacks_in_outbox(database_url)] == ["death"]
    end(database_url, jobs[2], "cancelled", port)
    end(database_url, jobs[3], "applied", port)
    assert [c["name"] for c in callbacks_in_outbox(database_url)] == ["death"]
    end(database_url, jobs[4], "applied", port)
    fired = callbacks_in_outbox(database_url)
    assert [c["name"] for c in fired] == ["death", "complete"], "on_success never: not clean"
    assert fired[1]["batch_id"] == str(batch)
    assert fired[1]["counts"] == {
        "applied": 3,
        "dead_lettered": 1,
        "discarded": 0,
        "cancelled": 1,
        "total": 5,
    }
    assert end(database_url, jobs[4], "applied", port) == []

    # a replay of the dead letter re-opens the batch (in the replay's transaction)
    conn = psycopg2.connect(database_url)
    with conn, conn.cursor() as cur:
        DeadLetter(
            job_id=jobs[1],
            queue=QUEUE,
            kind=CHILD,
            tenant_id="t1",
            correlation_id="c",
            payload={**child(), "job_id": str(jobs[1]), "correlation_id": "c"},
            attempts=1,
            last_error="boom",
            error_type="Broken",
            reason="permanent_error",
            headers={BATCH_HEADER: str(batch)},
        ).write(cur)
    replayed: list[Any] = []
    replay_dead_letters(
        conn, lambda queue, payload, opts=None: replayed.append(opts) or payload["job_id"]
    )
    conn.close()
    assert replayed == [{"headers": {BATCH_HEADER: str(batch)}}], "the child stays in its batch"
    open_again = "SELECT outcome FROM core.batch_jobs WHERE job_id = %s"
    assert query(database_url, open_again, str(jobs[1]))[0][0] is None
    end(database_url, jobs[1], "applied", port)
    names = [c["name"] for c in callbacks_in_outbox(database_url)]
    assert names == ["death", "complete"], "one child still cancelled: not clean"


def test_an_empty_batch_completes_at_once_and_bad_callbacks_are_refused(
    port: QueuePort, database_url: str
) -> None:
    query(database_url, "TRUNCATE core.outbox, core.batches CASCADE")
    make_batch(port, database_url, 0)
    assert sorted(c["name"] for c in callbacks_in_outbox(database_url)) == ["complete", "success"]
    conn = psycopg2.connect(database_url)
    with pytest.raises(ValueError, match=r"on_complete\.queue"):
        port.batch(on_complete=Callback("", CALLBACK, "t1"), tx=conn).__enter__()
    with pytest.raises(ValueError, match=r"on_success\.kind"):
        port.batch(on_success=Callback(QUEUE, "nodots", "t1"), tx=conn).__enter__()
    with pytest.raises(ValueError, match=r"on_death\.data: batch_id"):
        port.batch(on_death=Callback(QUEUE, CALLBACK, "t1", {"batch_id": 1}), tx=conn).__enter__()
    with pytest.raises(ValueError, match=r"on_complete: unknown field\(s\) qeue"):
        port.batch(on_complete={"qeue": QUEUE}, tx=conn).__enter__()
    with pytest.raises(ValueError, match="batch\\(\\) needs tx="):
        port.batch(on_complete=cb("x")).__enter__()
    conn.rollback()
    conn.close()


def test_rolled_back_batch_never_existed(port: QueuePort, database_url: str) -> None:
    query(database_url, "TRUNCATE core.outbox, core.batches CASCADE")
    conn = psycopg2.connect(database_url)
    with pytest.raises(LookupError), conn:
        with port.batch(on_complete=cb("complete"), tx=conn) as batch:
            batch.publish(QUEUE, child())
        raise LookupError("the request failed after")
    conn.close()
    assert query(database_url, "SELECT count(*) FROM core.batches")[0][0] == 0
    assert query(database_url, "SELECT count(*) FROM core.outbox")[0][0] == 0


def test_the_last_two_endings_at_once_fire_one_callback(port: QueuePort, database_url: str) -> None:
    """Two transactions bring the last two shards to zero at the same moment: the test
    holds the batch's row lock until both wait on it, then lets them go."""
    query(database_url, "TRUNCATE core.outbox, core.batches CASCADE")
    picked: dict[int, str] = {}
    while len(picked) < 2:  # one child in each of the two shards
        job = str(uuid7())
        shard = query(database_url, "SELECT ((hashtext(%s) %% 2) + 2) %% 2", job)[0][0]
        picked.setdefault(int(shard), job)
    conn = psycopg2.connect(database_url)
    with (
        conn,
        conn.cursor() as cur,
        port.batch(on_complete=cb("complete"), on_success=cb("success"), shards=2, tx=cur) as b,
    ):
        first = b.publish(QUEUE, {**child(), "job_id": picked[0]})
        second = b.publish(QUEUE, {**child(), "job_id": picked[1]})
    conn.close()
    batch = b.id
    query(database_url, "TRUNCATE core.outbox")
    holder = psycopg2.connect(database_url)
    hold = holder.cursor()
    hold.execute("SELECT 1 FROM core.batches WHERE batch_id = %s FOR UPDATE", (str(batch),))
    errors: list[BaseException] = []

    def run(job: uuid.UUID) -> None:
        try:
            end(database_url, job, "applied", port)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(job,)) for job in (first, second)]
    for thread in threads:
        thread.start()
    wait_until(
        lambda: (
            query(
                database_url,
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = "
                "'core.batches'::regclass OR (NOT granted AND locktype = 'transactionid')",
            )[0][0]
            >= 2
        ),
        timeout=10,
        message="both endings wait on the batch",
    )
    holder.commit()
    holder.close()
    for thread in threads:
        thread.join(10)
    assert errors == []
    assert [c["name"] for c in callbacks_in_outbox(database_url)] == ["complete", "success"]


def test_an_ending_during_a_replays_reopen_waits_for_it_and_counts(
    port: QueuePort, database_url: str
) -> None:
    """The replay re-opens a dead-lettered child and publishes it before committing; the
    child, applied meanwhile, counts once the re-open committed (not skipped as ended)."""
    query(database_url, "TRUNCATE core.outbox, core.batches CASCADE")
    batch, job = make_batch(port, database_url, 1, shards=1)
    end(database_url, job, "dead_lettered", port)
    replay = psycopg2.connect(database_url)
    replay.cursor().execute(
        load_queries("dead_letters")["reopen_batch_child"], {"job": str(job), "batch": str(batch)}
    )
    counted: list[list[uuid.UUID]] = []
    applied = threading.Thread(
        target=lambda: counted.append(end(database_url, job, "applied", port))
    )
    applied.start()
    wait_until(
        lambda: query(database_url, "SELECT count(*) FROM pg_locks WHERE NOT granted")[0][0] >= 1,
        timeout=10,
        message="the ending waits on the re-open",
    )
    replay.commit()
    replay.close()
    applied.join(10)
    assert counted == [[batch]]
    assert [c["name"] for c in callbacks_in_outbox(database_url)] == [
        "death",
        "complete",
        "success",
    ]


def test_a_session_that_lost_the_prepared_ending_prepares_it_again(
    port: QueuePort, database_url: str
) -> None:
    query(database_url, "TRUNCATE core.outbox, core.batches CASCADE")
    batch, first, second = make_batch(port, database_url, 2)
    conn = psycopg2.connect(database_url)
    with conn, conn.cursor() as cur:
        assert count_ending(cur, first, "applied", lambda: port) == [batch]
        cur.execute("DEALLOCATE ALL")  # e.g. a pooler's reset between sessions
    with pytest.raises(psycopg2.errors.InvalidSqlStatementName), conn, conn.cursor() as cur:
        count_ending(cur, second, "applied", lambda: port)
    with conn, conn.cursor() as cur:  # the delivery's next try
        assert count_ending(cur, second, "applied", lambda: port) == [batch]
    conn.close()
    assert [c["name"] for c in callbacks_in_outbox(database_url)] == ["complete", "success"]


def test_the_ending_is_planned_once_per_session_not_once_per_child(
    port: QueuePort, database_url: str
) -> None:
    """A consumer's session counts thousands of endings with the batch id its message
    named: the prepared ending must run its generic plan, not be planned again per child
    (planning took twice as long as running it). PostgreSQL plans a prepared statement
    for its parameters five times, then keeps the generic plan unless that one looks
    dearer: a lookup the generic plan cannot make by primary key kept it replanning."""
    query(database_url, "TRUNCATE core.outbox, core.batches CASCADE")
    batch, *children = make_batch(port, database_url, 300)
    # the children of another batch of 20,000 just inserted, which no autovacuum has
    # analyzed yet (as in a fresh install's first big batch): no statistics
    other = uuid7()
    query(
        database_url,
        "INSERT INTO core.batches (batch_id, profile, shards) VALUES (%s, 'test', 32); "
        "INSERT INTO core.batch_jobs (batch_id, job_id, queue, kind, tenant_id) "
        "SELECT %s, gen_random_uuid(), 'q', 'k', 't1' FROM generate_series(1, 20000); "
        "DELETE FROM pg_statistic WHERE starelid = 'core.batch_jobs'::regclass; "
        "UPDATE pg_class SET reltuples = -1 WHERE oid = 'core.batch_jobs'::regclass",
        str(other),
        str(other),
    )
    jobs = children[:12]
    conn = psycopg2.connect(database_url)
    try:
        for job in jobs:
            with conn, conn.cursor() as cur:
                assert count_ending(cur, job, "applied", lambda: port, batch) == [batch]
                assert count_ending(cur, job, "applied", lambda: port, batch) == []  # once
        with conn, conn.cursor() as cur:  # a cancel does not know the batch: found by job
            assert count_ending(cur, children[12], "cancelled", lambda: port) == [batch]
            cur.execute(
                "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE name LIKE 'platform_batch_end%%'"
            )
            plans = cur.fetchall()
    finally:
        conn.close()
    assert len(plans) == 1, plans
    _name, generic, custom = plans[0]
    assert custom == 5 and generic == 2 * len(jobs) + 1 - custom, plans
    assert query(
        database_url,
        "SELECT (SELECT sum(remaining) FROM core.batch_shards), "
        "(SELECT count(*) FROM core.batch_jobs WHERE outcome IS NOT NULL)",
    ) == [(300 - 13, 13)]
    assert callbacks_in_outbox(database_url) == []
    query(database_url, "DELETE FROM core.batches WHERE batch_id = %s", str(other))


def test_an_ending_sent_with_the_commit_counts_once_and_the_last_of_a_shard_falls_back(
    port: QueuePort, database_url: str
) -> None:
    """The consumer sends a child's ending with its COMMIT, in one round trip. An ending
    that brings a shard to zero must not commit before the batch's completion is checked:
    nothing is counted or committed, the transaction is open again with the handler's
    work, and the ordinary count then fires the callbacks, once."""
    query(database_url, "TRUNCATE core.outbox, core.batches CASCADE")
    batch, first, second, last = make_batch(port, database_url, 3, shards=1)
    conn = psycopg2.connect(database_url)
    conn.autocommit = True  # as the consumer's connection: the claim's BEGIN opens it
    cur = conn.cursor()

    def outcomes() -> dict[str, str | None]:
        rows = query(database_url, "SELECT job_id::text, outcome FROM core.batch_jobs")
        return {job: outcome for job, outcome in rows}

    def applied(job: uuid.UUID) -> bool:
        return is_processed_elsewhere(database_url, job)

    try:
        for job in (first, second):
            assert claim(cur, job, "c1", begin_transaction=True)
            assert count_applied_with_commit(cur, job, RunningChild(batch)) is True
            assert cur.statusmessage == "COMMIT"
            assert conn.info.transaction_status == TRANSACTION_STATUS_IDLE
            assert applied(job)
        cur.execute("BEGIN")  # counted again (an ending that raced another): nothing
        assert count_applied_with_commit(cur, first, RunningChild(batch)) is True
        assert outcomes() == {str(first): "applied", str(second): "applied", str(last): None}
        assert query(database_url, "SELECT remaining FROM core.batch_shards") == [(1,)]

        added = RunningChild(batch, [ChildRow(uuid7(), QUEUE, CHILD, "t1")])
        assert claim(cur, last, "c1", begin_transaction=True)
        assert count_applied_with_commit(cur, last, added) is False  # they join first
        assert count_applied_with_commit(cur, last, RunningChild(batch)) is False
        assert conn.info.transaction_status == TRANSACTION_STATUS_INTRANS
        assert not applied(last)  # not committed
        assert outcomes()[str(last)] is None  # not counted
        assert callbacks_in_outbox(database_url) == []
        count_applied(cur, last, RunningChild(batch), lambda: port)
        cur.execute("COMMIT")
    finally:
        conn.close()
    assert applied(last)
    assert outcomes()[str(last)] == "applied"
    assert query(database_url, "SELECT remaining FROM core.batch_shards") == [(0,)]
    assert [c["name"] for c in callbacks_in_outbox(database_url)] == ["complete", "success"]

    # a session that lost the prepared ending: the delivery fails once; its next try
    # prepares it again in the round trip of an ending that is the last of its shard
    query(database_url, "TRUNCATE core.outbox")
    batch, only, lost = make_batch(port, database_url, 2, shards=1)
    conn = psycopg2.connect(database_url)
    conn.autocommit = True
    cur = conn.cursor()
    try:
        assert claim(cur, lost, "c1", begin_transaction=True)
        assert count_applied_with_commit(cur, lost, RunningChild(batch)) is True
        cur.execute("DEALLOCATE ALL")  # e.g. a pooler's reset between sessions
        assert claim(cur, only, "c1", begin_transaction=True)
        with pytest.raises(psycopg2.errors.InvalidSqlStatementName):
            count_applied_with_commit(cur, only, RunningChild(batch))
        cur.execute("ROLLBACK")
        assert claim(cur, only, "c1", begin_transaction=True)  # the delivery's next try
        assert count_applied_with_commit(cur, only, RunningChild(batch)) is False
        count_applied(cur, only, RunningChild(batch), lambda: port)
        cur.execute("COMMIT")
    finally:
        conn.close()
    assert applied(only)
    assert [c["name"] for c in callbacks_in_outbox(database_url)] == ["complete", "success"]


def is_processed_elsewhere(database_url: str, job: uuid.UUID) -> bool:
    """Whether the job's claim is committed (read on a connection of its own)."""
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            return is_processed(cur, job, "c1")
    finally:
        conn.close()
