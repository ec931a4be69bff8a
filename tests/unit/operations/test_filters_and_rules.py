"""Filters of operations and the cancel rule's match: pure logic, no servers."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from platform_tasks.consumer.cancels import Rule, job_time
from platform_tasks.envelope import uuid7
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
    before = uuid7(int((cutoff - timedelta(seconds=1)).timestamp() * 1000))
    after = uuid7(int((cutoff + timedelta(seconds=1)).timestamp() * 1000))
    assert job_time(before) is not None
    assert rule.matches(job_id=before, tenant_id="gone", kind="a.b", queue="q")
    assert not rule.matches(job_id=after, tenant_id="gone", kind="a.b", queue="q")
    assert not rule.matches(job_id=before, tenant_id="stay", kind="a.b", queue="q")
    # a job id that carries no time (not uuid7) always counts as published before
    assert rule.matches(job_id=uuid.uuid4(), tenant_id="gone", kind=None, queue=None)
