"""Filters of operations and the cancel rule's match: pure logic, no servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from platform_tasks.consumer.cancels import Rule
from platform_tasks.observability.trace_context import (
    PUBLISH_TIME_HEADER,
    outgoing_headers,
    publish_time_of,
    without_publish_time,
)
from platform_tasks.operations import JobFilter, OperationFilter


def test_operation_filter_round_trips_its_canonical_json() -> None:
    where = OperationFilter(
        queue="q", error_type="Timeout", since=datetime(2026, 12, 1, 12, 0), until=None
    )
    data = where.to_json()
    assert data == {
        "queue": "q",
        "kind": None,
        "tenant_id": None,
        "error_type": "Timeout",
        "since": "2026-12-01T12:00:00+00:00",
        "until": None,
    }
    assert OperationFilter.from_json(data) == where
    assert OperationFilter().is_empty and not where.is_empty


def test_operation_filter_refuses_bad_input_naming_the_field() -> None:
    with pytest.raises(ValueError, match="'until'"):
        OperationFilter(since=datetime(2026, 12, 2, tzinfo=UTC), until=datetime(2026, 12, 1))
    with pytest.raises(ValueError, match=r"unknown filter field.*colour"):
        OperationFilter.from_json({"colour": "red"})
    with pytest.raises(ValueError, match="'tenant_id'"):
        OperationFilter(tenant_id=" ")
    with pytest.raises(ValueError, match="at least one of"):
        JobFilter()


def test_cancel_rule_matches_jobs_published_up_to_its_cutoff() -> None:
    cutoff = datetime.now(UTC)
    rule = Rule(7, JobFilter(tenant_id="gone"), cutoff, cutoff + timedelta(days=1))
    before = cutoff.timestamp() - 1
    after = cutoff.timestamp() + 1
    assert rule.matches(published=before, tenant_id="gone", kind="a.b", queue="q")
    assert rule.matches(published=cutoff.timestamp(), tenant_id="gone", kind="a.b", queue="q")
    assert not rule.matches(published=after, tenant_id="gone", kind="a.b", queue="q")
    assert not rule.matches(published=before, tenant_id="stay", kind="a.b", queue="q")
    # a message without a publish time (published before the header existed) counts as
    # published before the cancel
    assert rule.matches(published=None, tenant_id="gone", kind=None, queue=None)


def test_the_publish_time_is_read_from_the_header_never_from_the_job_id() -> None:
    cutoff = datetime.now(UTC)
    rule = Rule(7, JobFilter(tenant_id="gone"), cutoff, cutoff + timedelta(days=1))
    sent_after = {PUBLISH_TIME_HEADER: cutoff.timestamp() + 5}
    assert publish_time_of(sent_after) == cutoff.timestamp() + 5
    assert not rule.matches(
        published=publish_time_of(sent_after), tenant_id="gone", kind=None, queue=None
    )
    # unreadable values are no time: never an error
    for bad in ("soon", float("nan"), float("inf"), 1e300, -1.0, True, None, [1]):
        assert publish_time_of({PUBLISH_TIME_HEADER: bad}) is None
    assert publish_time_of(None) is None and publish_time_of({}) is None


def test_a_new_message_gets_a_publish_time_and_a_retry_keeps_its_own() -> None:
    fresh = outgoing_headers({}, published_at=10.0, publish_time=5.0)
    assert fresh[PUBLISH_TIME_HEADER] == 5.0
    assert PUBLISH_TIME_HEADER not in fresh.get("platform_headers", [])
    retried = outgoing_headers({PUBLISH_TIME_HEADER: 3.0, "x-a": "1"}, published_at=99.0)
    assert retried[PUBLISH_TIME_HEADER] == 3.0
    assert retried["platform_headers"] == ["x-a"]
    # a replay publishes anew: the stored publish time is dropped
    assert without_publish_time({PUBLISH_TIME_HEADER: 3.0, "x-a": "1"}) == {"x-a": "1"}
