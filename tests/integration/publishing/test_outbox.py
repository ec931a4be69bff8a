"""The outbox write and relay against real PostgreSQL and Redis, without a worker.

The write: a row only in a usable transaction, the envelope validated before it, the
message the bytes a direct publish sends. The relay: the stored bytes onto the broker as
they are, woken by the commit's notification, and any number of relays at once without
a row published twice.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg2
import pytest
import redis

from platform_tasks import QueuePort, create_app
from platform_tasks.app import PlatformCelery
from platform_tasks.errors import EnvelopeError
from platform_tasks.keys import delay_keys
from platform_tasks.observability.context import current_correlation_id
from platform_tasks.observability.trace_context import current_trace_headers
from platform_tasks.postgres.queries import load_queries
from platform_tasks.publishing.delay_store import DelayStore
from platform_tasks.publishing.outbox import OutboxTransactionError, handler_publishes
from platform_tasks.publishing.outbox_relay import OutboxRelay
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.support.database import query

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def app(settings: PlatformSettings) -> Iterator[PlatformCelery]:
    application = create_app("outbox_test", settings=settings)
    yield application
    application.close()


@pytest.fixture
def port(app: PlatformCelery) -> Iterator[QueuePort]:
    queue_port = QueuePort(app)
    yield queue_port
    queue_port.close()


@pytest.fixture
def conn(database_url: str) -> Iterator[Any]:
    connection = psycopg2.connect(database_url)
    yield connection
    connection.close()


def payload(**extra: object) -> dict[str, object]:
    return {"tenant_id": "t-1", "kind": "billing.charge", "data": {"n": 1}, **extra}


def rows(database_url: str) -> list[tuple[Any, ...]]:
    with psycopg2.connect(database_url) as c, c.cursor() as cur:
        cur.execute("SELECT job_id::text, queue, message, due_ms FROM core.outbox ORDER BY id")
        found = cur.fetchall()
    c.close()
    return found


def test_the_row_is_the_message_a_direct_publish_sends_and_the_relay_pushes_it_as_is(
    app: PlatformCelery, port: QueuePort, conn: Any, database_url: str, redis_client: redis.Redis
) -> None:
    corr = current_correlation_id.set("corr-outbox")
    trace = current_trace_headers.set({"traceparent": TRACEPARENT})
    try:
        direct = port.publish("billing", payload(), {"headers": {"x-team": "a"}}, tx=None)
        with conn:
            staged = port.publish("billing", payload(), {"headers": {"x-team": "a"}}, tx=conn)
    finally:
        current_correlation_id.reset(corr)
        current_trace_headers.reset(trace)
    [(job, queue, message, due)] = rows(database_url)
    assert (job, queue, due) == (str(staged), "billing", None)
    [(target,)] = query(database_url, "SELECT target FROM core.outbox")
    assert target == "billing", "the Redis list the row is pushed onto"
    [sent] = [json.loads(raw) for raw in redis_client.lrange("billing", 0, -1)]
    stored = json.loads(message)
    # the same message but for what differs per publish: ids, tags, times
    for msg in (sent, stored):
        msg["properties"].pop("delivery_tag")
        msg["properties"].pop("correlation_id")
        msg["properties"].pop("argsrepr", None)
        msg.pop("body")
        for name in ("id", "root_id", "argsrepr", "platform_published_at", "platform_publish_time"):
            msg["headers"].pop(name)
    assert stored == sent
    assert sent["headers"]["traceparent"] == TRACEPARENT
    assert sent["headers"]["x-team"] == "a"

    relay = OutboxRelay(app, metrics=False)
    try:
        assert relay.run_once() == 1
    finally:
        relay.close()
    assert redis_client.lindex("billing", 0).decode() == message, "the stored bytes, as is"
    assert rows(database_url) == []
    args, _kwargs, _embed = json.loads(base64.b64decode(json.loads(message)["body"]))
    assert args[0]["correlation_id"] == "corr-outbox"
    assert str(direct) != str(staged)


def test_a_rolled_back_publish_leaves_no_row_and_a_bad_envelope_is_refused_before_the_insert(
    port: QueuePort, conn: Any, database_url: str
) -> None:
    port.publish("billing", payload(), tx=conn)
    conn.rollback()
    assert rows(database_url) == []
    with pytest.raises(EnvelopeError, match="tenant_id"):
        port.publish("billing", payload(tenant_id="NOT VALID!"), tx=conn)
    with pytest.raises(EnvelopeError):
        port.schedule("billing", payload(kind=""), datetime.now(UTC), tx=conn)
    assert conn.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    conn.commit()
    assert rows(database_url) == []


def test_an_unusable_transaction_is_a_clear_error_naming_it(
    port: QueuePort, conn: Any, database_url: str
) -> None:
    with pytest.raises(OutboxTransactionError, match="tx must be a PostgreSQL connection"):
        port.publish("billing", payload(), tx="postgresql://db")
    cur = conn.cursor()
    with pytest.raises(psycopg2.errors.DivisionByZero):
        cur.execute("SELECT 1/0")
    with pytest.raises(OutboxTransactionError, match="aborted"):
        port.publish("billing", payload(), tx=conn)
    with pytest.raises(OutboxTransactionError, match="aborted"):
        port.publish("billing", payload(), tx=cur)
    conn.rollback()
    cur.close()
    with pytest.raises(OutboxTransactionError, match="cursor given is closed"):
        port.publish("billing", payload(), tx=cur)
    auto = psycopg2.connect(database_url)
    auto.autocommit = True
    with pytest.raises(OutboxTransactionError, match="autocommit"):
        port.publish("billing", payload(), tx=auto)
    auto.close()
    with pytest.raises(OutboxTransactionError, match="connection given is closed"):
        port.publish("billing", payload(), tx=auto)
    assert rows(database_url) == []


def test_publishes_in_a_handler_join_its_transaction_with_ids_derived_per_attempt(
    port: QueuePort, conn: Any, database_url: str, redis_client: redis.Redis
) -> None:
    parent = port.envelope(payload()).job_id
    ids = []
    for _attempt in range(2):
        cur = conn.cursor()
        with handler_publishes(cur, parent, "billing.charge"):
            first = port.publish("billing", payload())
            second = port.schedule("billing", payload(), datetime.now(UTC) + timedelta(hours=1))
            given = port.publish("billing", payload(job_id=str(port.envelope(payload()).job_id)))
            outside = port.publish("billing", payload(), tx=None)
        ids.append((first, second))
        conn.rollback()  # the attempt failed: nothing it published exists
    assert ids[0] == ids[1], "a retried attempt publishes the same child ids"
    first, second = ids[0]
    assert first != second and first.version == 7 and second.version == 7
    assert first.int >> 80 == parent.int >> 80, "children sort beside their parent"
    assert given not in (first, second)
    assert rows(database_url) == []
    assert redis_client.llen("billing") == 2, "tx=None published at once, each attempt"
    assert str(outside) in redis_client.lindex("billing", 0).decode()

    with handler_publishes(conn.cursor(), parent, "billing.charge"):
        port.publish("billing", payload())
    conn.commit()
    assert [row[0] for row in rows(database_url)] == [str(first)]


def test_a_scheduled_row_keeps_its_due_time_through_the_relay(
    app: PlatformCelery, port: QueuePort, conn: Any, database_url: str, redis_client: redis.Redis
) -> None:
    run_at = datetime.now(UTC) + timedelta(minutes=5)
    with conn:
        job = port.schedule("billing", payload(), run_at, tx=conn)
    [(_, _, message, due)] = rows(database_url)
    assert due == int(run_at.timestamp() * 1000)
    relay = OutboxRelay(app, metrics=False)
    try:
        assert relay.run_once() == 1
    finally:
        relay.close()
    store = DelayStore(redis_client, delay_keys("test"))
    assert store.next_due_ms() == due
    assert store.pending() == 1
    assert redis_client.llen("billing") == 0
    [stored] = redis_client.hvals(store.keys.entries)
    assert stored.decode() == message
    assert str(job) in message


def test_concurrent_relays_publish_every_row_once(
    settings: PlatformSettings,
    port: QueuePort,
    conn: Any,
    database_url: str,
    redis_client: redis.Redis,
) -> None:
    count = 2000
    with conn:
        published = {str(port.publish("billing", payload(), tx=conn)) for _ in range(count)}
    small = settings.model_copy(update={"outbox_batch_size": 50})  # many batches to interleave
    app = create_app("outbox_relays_test", settings=small)
    relays = [OutboxRelay(app, metrics=False) for _ in range(4)]
    moved = [0] * len(relays)

    def drain(index: int) -> None:
        moved[index] = relays[index].run_once()

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(len(relays))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for relay in relays:
        relay.close()
    app.close()
    assert sum(moved) == count
    assert sum(1 for m in moved if m) > 1, "the relays shared the work"
    pushed = [json.loads(raw)["headers"]["id"] for raw in redis_client.lrange("billing", 0, -1)]
    assert len(pushed) == count and set(pushed) == published
    assert rows(database_url) == []


def test_the_commit_wakes_a_running_relay_long_before_its_poll_interval(
    settings: PlatformSettings, port: QueuePort, conn: Any, redis_client: redis.Redis
) -> None:
    slow = settings.model_copy(update={"outbox_poll_interval_seconds": 60.0})
    app = create_app("outbox_wake_test", settings=slow)
    relay = OutboxRelay(app, metrics=False)
    relay.start()
    try:
        for n in (1, 2):  # the first may be found by the first pass; the second is woken
            with conn:
                job = port.publish("billing", payload(), tx=conn)
            wait_until(
                lambda n=n: redis_client.llen("billing") == n,
                timeout=10,
                interval=0.01,
                message="the committed row relayed (notified, not polled: the poll is 60 s)",
            )
            assert str(job) in redis_client.lindex("billing", 0).decode()
    finally:
        relay.stop()
        app.close()


def test_a_relay_that_cannot_reach_the_broker_reports_the_lag_growing(
    settings: PlatformSettings, port: QueuePort, conn: Any, redis_client: redis.Redis
) -> None:
    from prometheus_client import REGISTRY

    with conn:
        for _ in range(3):
            port.publish("billing", payload(), tx=conn)
    unreachable = settings.model_copy(
        update={
            "broker_url": "redis://127.0.0.1:1/0",  # nothing listens on port 1
            "metrics_port": 9,  # measured when metrics are served (nothing is served here)
            "outbox_poll_interval_seconds": 0.05,
        }
    )
    app = create_app("outbox_stalled_test", settings=unreachable)
    relay = OutboxRelay(app)
    relay.start()
    try:
        wait_until(
            lambda: (
                REGISTRY.get_sample_value("platform_outbox_rows_waiting") == 3
                and (REGISTRY.get_sample_value("platform_outbox_lag_seconds") or 0) > 0.2
            ),
            timeout=20,
            interval=0.05,
            message="the stalled relay reports 3 rows waiting and a growing lag",
        )
    finally:
        relay.stop()
        app.close()
    assert redis_client.llen("billing") == 0

    healthy = settings.model_copy(update={"metrics_port": 9})
    app = create_app("outbox_healthy_test", settings=healthy)
    relay = OutboxRelay(app)
    relay.start()
    try:
        wait_until(
            lambda: (
                REGISTRY.get_sample_value("platform_outbox_rows_waiting") == 0
                and REGISTRY.get_sample_value("platform_outbox_lag_seconds") == 0
            ),
            timeout=20,
            interval=0.05,
            message="the outbox drained and the gauges back at 0",
        )
    finally:
        relay.stop()
        app.close()
    assert redis_client.llen("billing") == 3


def test_a_unique_publish_in_a_transaction_takes_its_key_only_once_committed(
    app: PlatformCelery, port: QueuePort, conn: Any, database_url: str, redis_client: redis.Redis
) -> None:
    hour = timedelta(hours=1)
    trace = current_trace_headers.set({"traceparent": TRACEPARENT})
    try:
        with conn:
            first = port.publish("billing", payload(), tx=conn, unique_key="k", unique_for=hour)
            port.publish("billing", payload(), tx=conn, unique_key="k", unique_for=hour)
        port.publish("billing", payload(), tx=conn, unique_key="k2", unique_for=hour)
        conn.rollback()
    finally:
        current_trace_headers.reset(trace)
    assert redis_client.llen("billing") == 0, "no lock, no message before the relay"
    relay = OutboxRelay(app, metrics=False)
    try:
        assert relay.run_once() == 2
    finally:
        relay.close()
    [sent] = [json.loads(raw) for raw in redis_client.lrange("billing", 0, -1)]
    assert sent["headers"]["id"] == str(first), "the key's first committed job, once"
    assert sent["headers"]["traceparent"] == TRACEPARENT, "the publishing code's trace"
    again = port.publish("billing", payload(), tx=None, unique_key="k", unique_for=hour)
    assert again == first, "the key is held by the relayed job"
    other = port.publish("billing", payload(), tx=None, unique_key="k2", unique_for=hour)
    assert redis_client.llen("billing") == 2, "the rolled back publish never took k2"
    assert str(other) in redis_client.lindex("billing", 0).decode()


def _scanned(plan: dict[str, Any]) -> int:
    """Rows the plan's scans of tables and indexes produced or read and threw away."""
    own = 0
    if plan["Node Type"].endswith("Scan") and ("Relation Name" in plan or "Index Name" in plan):
        own = plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)
    return own + sum(_scanned(child) for child in plan.get("Plans", []))


def test_a_claim_reads_only_its_batch_whatever_the_table_statistics(
    port: QueuePort, conn: Any
) -> None:
    """The table churns faster than its statistics follow (here: truncated, so PostgreSQL
    believes it nearly empty). A claim planned from such statistics must still read about
    its batch, not every row waiting: that would make draining a backlog quadratic."""
    with conn:
        for _ in range(4000):
            port.publish("billing", payload(), tx=conn)
    sql = load_queries("outbox")
    with conn.cursor() as cur:
        cur.execute(sql["claim_begin"])
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql["claim_batch"], ("test", 500))
        [[[explained]]] = cur.fetchall()
    conn.rollback()
    assert explained["Plan"]["Actual Rows"] == 500
    assert _scanned(explained["Plan"]) <= 2 * 500, "the claim read rows beyond its batch"


def test_schedule_many_in_a_transaction_stores_every_item_or_none(
    app: PlatformCelery, port: QueuePort, conn: Any, database_url: str, redis_client: redis.Redis
) -> None:
    later = datetime.now(UTC) + timedelta(minutes=5)
    past = datetime.now(UTC) - timedelta(seconds=1)
    port.schedule_many("billing", [(payload(), later), (payload(), past)], tx=conn)
    conn.rollback()
    assert rows(database_url) == [], "rolled back: no job"
    with pytest.raises(EnvelopeError, match="tenant_id"):
        port.schedule_many(
            "billing", [(payload(), later), (payload(tenant_id="NO!"), later)], tx=conn
        )
    conn.commit()
    assert rows(database_url) == [], "a bad item stores none"

    with conn:
        jobs = port.schedule_many("billing", [(payload(), later), (payload(), past)], tx=conn)
    assert redis_client.llen("billing") == 0, "nothing leaves before the relay"
    stored = rows(database_url)
    assert [(job, due) for job, _, _, due in stored] == [
        (str(jobs[0]), int(later.timestamp() * 1000)),
        (str(jobs[1]), None),
    ], "the due time kept; an item already due is published when relayed"
    relay = OutboxRelay(app, metrics=False)
    try:
        assert relay.run_once() == 2
    finally:
        relay.close()
    store = DelayStore(redis_client, delay_keys("test"))
    assert store.pending() == 1 and store.next_due_ms() == int(later.timestamp() * 1000)
    assert str(jobs[1]) in redis_client.lindex("billing", 0).decode()

    parent = port.envelope(payload()).job_id
    derived = []
    for _attempt in range(2):
        with handler_publishes(conn.cursor(), parent, "billing.charge"):
            derived.append(port.schedule_many("billing", [(payload(), later)] * 2))
        conn.rollback()
    assert derived[0] == derived[1] and len(set(derived[0])) == 2, "ids derived per attempt"
