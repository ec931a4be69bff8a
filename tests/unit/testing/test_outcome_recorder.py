"""The pytest kit's outcome recorder: each wait gets the job's next settled delivery, in
the order the worker settled them, and a wait with nothing to return ends at its deadline.

The worker side is a real thread calling the hook methods the pipeline calls; the full
kit runs against real servers in ``tests/integration/testing/test_pytest_kit.py``.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from platform_tasks.consumer.delivery import Delivery
from platform_tasks.consumer.verdicts import Applied, Duplicate, RetryAt
from platform_tasks.envelope import Envelope, uuid7
from platform_tasks.testing.consumer import OutcomeRecorder

DELIVERY = Delivery(consumer="shop.record_order", queue="default", header_attempt=1, priority=None)


def envelope() -> Envelope[dict]:
    return Envelope[dict].model_validate(
        {
            "job_id": str(uuid7()),
            "tenant_id": "acme",
            "correlation_id": "c-1",
            "kind": "shop.record_order",
            "data": {},
        }
    )


def test_waits_return_a_jobs_deliveries_in_order_as_they_settle() -> None:
    recorder = OutcomeRecorder()
    job = envelope()
    other = envelope()
    go = threading.Event()
    retry_at = datetime.now(UTC) + timedelta(seconds=30)

    def worker() -> None:
        go.wait(10)
        recorder.on_retry_scheduled(DELIVERY, job, RetryAt(retry_at, 1, ConnectionError("x")))
        recorder.on_applied(DELIVERY, other, Applied(1))
        recorder.on_applied(DELIVERY, job, Applied(2))
        recorder.on_duplicate(DELIVERY, job, Duplicate("applied"))

    thread = threading.Thread(target=worker)
    thread.start()
    go.set()
    deadline = time.monotonic() + 10
    first, second, third = (recorder.wait_for(job.job_id, i, deadline) for i in range(3))
    thread.join(10)
    assert first is not None and second is not None and third is not None
    assert (first.status, first.attempt, first.retry_at, first.error_type) == (
        "retry_scheduled",
        1,
        retry_at,
        "ConnectionError",
    )
    assert (second.status, second.attempt) == ("applied", 2)
    assert (third.status, third.reason) == ("duplicate", "applied")
    assert [e.status for e in recorder.events(other.job_id)] == ["applied"]


def test_a_wait_with_nothing_to_return_ends_at_its_deadline() -> None:
    recorder = OutcomeRecorder()
    job = envelope()
    recorder.on_applied(DELIVERY, job, Applied(1))
    assert recorder.wait_for(job.job_id, 1, time.monotonic() + 0.2) is None
    recorder.clear()
    assert recorder.wait_for(job.job_id, 0, time.monotonic()) is None
