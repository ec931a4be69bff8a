"""The fan-out consumer against real Redis and PostgreSQL (run in this process)."""

from __future__ import annotations

import base64
import json
import logging
import threading
import uuid
import zlib
from datetime import UTC, datetime

import psycopg2
import pytest
import redis
from prometheus_client import REGISTRY

from platform_tasks import QueuePort
from platform_tasks.errors import ConfigurationError
from platform_tasks.fanout import fan_out, tenant_job_id
from platform_tasks.fanout.publisher import BatchPublisher
from platform_tasks.fanout.sources import check_tenants_query
from platform_tasks.jobs.runner import JobContext
from platform_tasks.observability.trace_context import PUBLISH_TIME_HEADER, PUBLISHED_AT_HEADER
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing import create_test_app

from .conftest import FanOutHarness, add_tenants, decode, queued

POINT = datetime(2025, 5, 6, 3, 0, tzinfo=UTC)  # 03:00 UTC: 1h and 3h are due


def ctx(name: str = "maintenance.test", point: datetime = POINT) -> JobContext:
    return JobContext(
        name=name,
        scheduled_for=point,
        cancel_requested=threading.Event(),
        logger=logging.getLogger("test"),
    )


def test_one_envelope_per_active_tenant_with_shared_correlation_and_the_point(
    harness: FanOutHarness, database_url: str, redis_client: redis.Redis
) -> None:
    add_tenants(database_url, [("acme", "nightly"), ("globex", "1h"), ("gone", "1h", False)])
    labels = {"job": "maintenance.test", "kind": "demo.recompute"}

    def sample(name: str, **extra: str) -> float:
        return REGISTRY.get_sample_value(name, {**labels, **extra}) or 0.0

    published_before = sample("platform_fanout_tenants_published_total")
    finished_before = sample("platform_fanout_runs_total", outcome="finished")
    durations_before = sample("platform_fanout_duration_seconds_count")
    fan_id = fan_out(ctx(), queue="work", kind="demo.recompute", data={"window_days": 7})
    [result] = harness.run_pending()
    assert (result.published_now, result.published_total) == (2, 2)
    assert sample("platform_fanout_tenants_published_total") == published_before + 2
    assert sample("platform_fanout_runs_total", outcome="finished") == finished_before + 1
    assert sample("platform_fanout_duration_seconds_count") == durations_before + 1
    envelopes = queued(redis_client, "work")
    assert [e["tenant_id"] for e in envelopes] == ["acme", "globex"]
    for envelope in envelopes:
        assert envelope["kind"] == "demo.recompute"
        assert envelope["correlation_id"] == f"fanout-{fan_id}"
        assert envelope["data"] == {"window_days": 7, "scheduled_for": "2025-05-06T03:00:00Z"}
        assert envelope["job_id"] == str(
            tenant_job_id("maintenance.test", POINT, "demo.recompute", envelope["tenant_id"])
        )


def test_batched_messages_are_what_queue_port_publish_sends(
    harness: FanOutHarness, database_url: str, redis_client: redis.Redis
) -> None:
    add_tenants(database_url, [(f"t-{n:03d}", "1h") for n in range(7)])
    fan_out(ctx(), queue="work", kind="demo.recompute")
    harness.run(
        harness.pending_fan_outs()[0], harness.settings.model_copy(update={"fanout_batch_size": 3})
    )
    batched = [decode(raw) for raw in reversed(redis_client.lrange("work", 0, -1))]
    assert len(batched) == 7
    for message, envelope in batched:
        harness.port.publish("reference", envelope)
        [raw] = redis_client.rpop("reference", 1) or []
        reference, same_envelope = decode(raw)
        assert same_envelope == envelope
        # the ready time is each message's own (the moment it was published), so
        # the batched one is no later than the reference published after it
        published = message["headers"].pop(PUBLISHED_AT_HEADER)
        assert 0 < published <= reference["headers"].pop(PUBLISHED_AT_HEADER)
        publish_time = message["headers"].pop(PUBLISH_TIME_HEADER)
        assert 0 < publish_time <= reference["headers"].pop(PUBLISH_TIME_HEADER)
        for part in ("headers", "content-type", "content-encoding"):
            assert message[part] == reference[part], part
        props = dict(message["properties"])
        ref_props = dict(reference["properties"])
        assert uuid.UUID(props.pop("delivery_tag")) != uuid.UUID(ref_props.pop("delivery_tag"))
        assert props.pop("delivery_info")["routing_key"] == "work"
        ref_props.pop("delivery_info")
        assert props == ref_props
        assert message["headers"]["argsrepr"].startswith(f"(job_id={envelope['job_id']} ")
        assert "scheduled_for" not in message["headers"]["argsrepr"]


def test_round_trips_are_one_per_batch(harness: FanOutHarness, redis_client: redis.Redis) -> None:
    publisher = BatchPublisher(harness.app, queue="work")
    envelopes = [
        harness.port.envelope({"tenant_id": f"t{n}", "kind": "a.b", "data": {}})
        for n in range(1200)
    ]
    redis_client.config_resetstat()
    for start in range(0, 1200, 500):
        publisher.publish(envelopes[start : start + 500])
    publisher.close()
    stats = redis_client.info("commandstats")
    assert stats["cmdstat_lpush"]["calls"] == 3
    assert publisher.round_trips == 3 and publisher.batched
    assert redis_client.llen("work") == 1200


def test_due_tiers_only(
    harness: FanOutHarness, database_url: str, redis_client: redis.Redis
) -> None:
    add_tenants(
        database_url, [("a", "1h"), ("b", "3h"), ("c", "6h"), ("d", "12h"), ("e", "nightly")]
    )
    fan_out(ctx(point=POINT), queue="work", kind="demo.recompute", tiers="due")
    fan_out(ctx(point=POINT.replace(hour=12)), queue="work", kind="demo.recompute", tiers="due")
    fan_out(ctx(point=POINT.replace(hour=0)), queue="work", kind="demo.recompute", tiers="due")
    harness.run_pending()
    by_point: dict[str, list[str]] = {}
    for envelope in queued(redis_client, "work"):
        by_point.setdefault(envelope["data"]["scheduled_for"], []).append(envelope["tenant_id"])
    assert by_point == {
        "2025-05-06T03:00:00Z": ["a", "b"],
        "2025-05-06T12:00:00Z": ["a", "b", "c", "d"],
        "2025-05-06T00:00:00Z": ["a", "b", "c", "d", "e"],
    }


def test_resumes_after_the_marker_and_a_finished_fan_out_publishes_nothing(
    harness: FanOutHarness, database_url: str, redis_client: redis.Redis
) -> None:
    add_tenants(database_url, [(f"t-{n:04d}", "nightly") for n in range(100)])
    fan_out(ctx(), queue="work", kind="demo.recompute")
    [envelope] = harness.pending_fan_outs()
    conn = psycopg2.connect(database_url)
    conn.autocommit = True
    with conn.cursor() as cur:  # an earlier delivery published up to t-0059, then died
        cur.execute(
            "INSERT INTO core.fanout_progress (job_id, job_name, point, kind, last_tenant_id, "
            "published) VALUES (%s, 'maintenance.test', %s, 'demo.recompute', 't-0059', 60)",
            (str(envelope.job_id), POINT),
        )
    result = harness.run(envelope)
    assert (result.resumed_after, result.published_now, result.published_total) == (
        "t-0059",
        40,
        100,
    )
    assert [e["tenant_id"] for e in queued(redis_client, "work")] == [
        f"t-{n:04d}" for n in range(60, 100)
    ]
    again = harness.run(envelope)
    assert again.already_finished and again.published_now == 0
    assert redis_client.llen("work") == 40
    with conn.cursor() as cur:
        cur.execute("SELECT published, finished_at IS NOT NULL FROM core.fanout_progress")
        assert cur.fetchall() == [(100, True)]
    conn.close()


def test_tenants_query_replaces_core_tenants(
    harness: FanOutHarness, database_url: str, redis_client: redis.Redis
) -> None:
    conn = psycopg2.connect(database_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("CREATE SCHEMA IF NOT EXISTS product")
        cur.execute("DROP TABLE IF EXISTS product.accounts")
        cur.execute("CREATE TABLE product.accounts (id int, plan text, name text)")
        cur.execute(
            "INSERT INTO product.accounts VALUES (2, 'pro', 'b%c'), (1, 'free', 'a'), "
            "(3, 'pro', 'x')"
        )
    conn.close()
    query = (
        "SELECT 'acct-' || id AS tenant_id, CASE plan WHEN 'pro' THEN '1h' "
        "ELSE 'nightly' END AS freshness_tier FROM product.accounts "
        "WHERE name NOT LIKE 'x%' -- a trailing comment and a literal %"
    )
    check_tenants_query(database_url, query)
    settings = harness.settings.model_copy(update={"tenants_query": query})
    fan_out(ctx(), queue="work", kind="demo.recompute", tiers="due")
    [result] = [harness.run(e, settings) for e in harness.pending_fan_outs()]
    assert [e["tenant_id"] for e in queued(redis_client, "work")] == ["acct-2"]
    assert result.published_total == 1


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            "SELECT 1 AS id, 'nightly' AS freshness_tier",
            "PLATFORM_TENANTS_QUERY: must return the columns tenant_id, freshness_tier; missing "
            "tenant_id (it returns: id, freshness_tier)",
        ),
        (
            "SELECT tenant_id FROM no_such_table",
            'PLATFORM_TENANTS_QUERY: the query failed: relation "no_such_table" does not exist',
        ),
    ],
)
def test_a_bad_tenants_query_is_a_start_up_error_naming_the_setting(
    database_url: str, query: str, message: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_tenants_query(database_url, query)
    assert str(caught.value) == message


def test_the_default_source_passes_the_check(database_url: str) -> None:
    check_tenants_query(database_url, None)


def test_an_unreachable_database_names_the_setting(settings: PlatformSettings) -> None:
    expected = "cannot connect to PLATFORM_DATABASE_URL"
    with pytest.raises(ConfigurationError, match=expected) as caught:
        check_tenants_query("postgresql://nobody:s3cr3t-pw@127.0.0.1:1/db", "SELECT 1")
    assert "s3cr3t-pw" not in str(caught.value)


def test_a_wire_format_the_template_cannot_prove_falls_back_to_send_task(
    settings: PlatformSettings, redis_client: redis.Redis
) -> None:
    """With ``task_compression`` the body is gzip, not the JSON the template rewrites: every
    message is then built through ``send_task`` and still reaches the queue intact."""
    app = create_test_app("fanout_gzip", settings=settings, task_compression="gzip")
    port = QueuePort(app)
    envelopes = [
        port.envelope({"tenant_id": f"t{n}", "kind": "a.b", "data": {"n": n}}) for n in range(5)
    ]
    publisher = BatchPublisher(app, queue="work")
    publisher.publish(envelopes)
    publisher.close()
    port.close()
    assert not publisher.batched
    bodies = []
    for raw in reversed(redis_client.lrange("work", 0, -1)):
        message = json.loads(raw)
        assert message["headers"]["compression"] == "application/x-gzip"
        body = zlib.decompress(base64.b64decode(message["body"]))  # kombu's "gzip" is zlib
        bodies.append(json.loads(body)[0][0])
    assert bodies == [e.to_message() for e in envelopes]


def test_a_tenant_id_that_is_not_a_valid_envelope_tenant_is_left_out_and_logged(
    harness: FanOutHarness,
    database_url: str,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_tenants(database_url, [("fine", "1h"), ("has space", "1h"), ("zeta", "1h")])
    fan_out(ctx(), queue="work", kind="demo.recompute")
    with caplog.at_level(logging.ERROR, logger="platform_tasks.fanout"):
        [result] = harness.run_pending()
    assert (result.published_total, result.invalid) == (2, 1)
    assert [e["tenant_id"] for e in queued(redis_client, "work")] == ["fine", "zeta"]
    [record] = [r for r in caplog.records if getattr(r, "event", "") == "fanout.tenant_invalid"]
    assert "'has space'" in record.getMessage()
