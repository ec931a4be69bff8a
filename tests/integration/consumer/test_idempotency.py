"""Idempotency in the work's own transaction, against the real PostgreSQL."""

from __future__ import annotations

import threading
from typing import Any

from platform_tasks.envelope import uuid7
from platform_tasks.testing.servers import wait_until
from tests.integration.consumer.conftest import Harness


def envelope(key: str = "k", **data: Any) -> dict[str, Any]:
    return {
        "job_id": str(uuid7()),
        "tenant_id": "tenant-1",
        "correlation_id": "corr-1",
        "kind": "tests.it.apply",
        "data": {"key": key, **data},
    }


def test_job_applies_once_and_commits_row_with_work(harness: Harness) -> None:
    payload = envelope("a")
    result = harness.apply(payload)
    assert result.state == "SUCCESS", result.traceback
    assert harness.rows("SELECT job_id::text, key FROM public.consumer_work") == [
        (payload["job_id"], "a")
    ]
    assert harness.rows(
        "SELECT consumer FROM core.processed_jobs WHERE job_id = %s", payload["job_id"]
    ) == [("tests.it.apply",)]


def test_duplicate_delivery_is_skipped_without_calling_handler(harness: Harness) -> None:
    payload = envelope("dup")
    assert harness.apply(payload).state == "SUCCESS"
    second = harness.apply(payload)
    assert second.state == "SUCCESS"
    assert harness.calls == [payload["job_id"]]
    assert harness.rows("SELECT count(*) FROM public.consumer_work") == [(1,)]


def test_handler_error_rolls_back_work_and_idempotency_row(harness: Harness) -> None:
    payload = envelope("boom", fail=True)
    result = harness.apply(payload)
    assert result.state == "RETRY"
    assert harness.calls == [payload["job_id"]]
    assert harness.rows("SELECT count(*) FROM public.consumer_work") == [(0,)]
    assert harness.rows("SELECT count(*) FROM core.processed_jobs") == [(0,)]
    # nothing of the failed attempt blocks the next one: attempt 2 (now healthy) applies
    healthy = dict(payload, data={"key": "boom"})
    assert harness.apply(healthy, attempt=2).state == "SUCCESS"
    assert harness.rows("SELECT count(*) FROM public.consumer_work") == [(1,)]
    assert harness.rows("SELECT count(*) FROM core.processed_jobs") == [(1,)]


def test_two_concurrent_deliveries_apply_exactly_once(harness: Harness) -> None:
    payload = envelope("race", block=True)
    results = race(harness, payload)
    assert results["first"].state == "SUCCESS"
    assert results["second"].state == "SUCCESS"
    assert harness.calls == [payload["job_id"]]
    assert harness.rows("SELECT count(*) FROM public.consumer_work") == [(1,)]
    assert harness.rows("SELECT count(*) FROM core.processed_jobs") == [(1,)]


def test_two_concurrent_copies_of_a_permanently_failing_job_are_dead_lettered_once(
    harness: Harness,
) -> None:
    """The copy that waited on the claim finds the job dead-lettered, not free to run.

    The first copy's handler fails with a PermanentError while the second copy waits on
    its claim. Rolling back the handler's work released the claim before the dead letter
    was written, so the second copy ran the handler as attempt 2 and wrote a second dead
    letter (seen once in the soak test: one job, two dead letters).
    """
    payload = envelope("doomed", block=True, permanent=True)
    results = race(harness, payload)
    states = sorted(r.state for r in results.values())
    assert states == ["FAILURE", "SUCCESS"], results  # one dead letter, one duplicate
    assert harness.calls == [payload["job_id"]], "the handler ran again for the waiting copy"
    rows = harness.rows(
        "SELECT attempts, reason, status FROM core.dead_letters WHERE job_id = %s",
        payload["job_id"],
    )
    assert rows == [(1, "permanent_error", "pending_review")]
    assert harness.rows("SELECT count(*) FROM public.consumer_work") == [(0,)]
    assert harness.rows("SELECT count(*) FROM core.processed_jobs") == [(0,)]


def race(harness: Harness, payload: dict[str, Any]) -> dict[str, Any]:
    """Two copies of the job: the second waits on the first's claim while its handler runs."""
    results: dict[str, Any] = {}

    def deliver(name: str) -> None:
        results[name] = harness.apply(payload)

    first = threading.Thread(target=deliver, args=("first",))
    first.start()
    assert harness.started.wait(10)
    second = threading.Thread(target=deliver, args=("second",))
    second.start()
    wait_until(
        lambda: claims_waiting(harness) == 1,
        timeout=10,
        message="second delivery blocked on the claim",
    )
    harness.release.set()
    first.join(15)
    second.join(15)
    assert not first.is_alive() and not second.is_alive()
    return results


def claims_waiting(harness: Harness) -> int:
    """Deliveries blocked on another delivery's claim of the same job."""
    rows = harness.rows(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query LIKE 'BEGIN; SELECT claimed, marked FROM core.claim_delivery%%'"
    )
    return int(rows[0][0])
