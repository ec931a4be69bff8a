"""A job that will never start frees its unique publish key at once: a dead letter made
before the handler ran (an envelope that does not validate) does not hold the key for
the rest of ``unique_for``. Real Redis broker and PostgreSQL, the consumer pipeline run
by Celery's ``apply``."""

from __future__ import annotations

from datetime import timedelta

from platform_tasks import QueuePort
from platform_tasks.limits.unique import UNIQUE_HEADER
from tests.integration.consumer.conftest import QUEUE, Harness


def test_a_job_dead_lettered_before_it_started_frees_its_unique_key(harness: Harness) -> None:
    port = QueuePort(harness.app)
    window = timedelta(hours=1)
    try:
        good = {"tenant_id": "t", "kind": "tests.it.apply", "data": {"key": "a"}}
        first = port.publish(QUEUE, good, unique_key="nightly-sync", unique_for=window)
        # the same job delivered with data its model refuses: a poison dead letter
        poison = {**good, "job_id": str(first), "data": {"unexpected": True}}
        result = harness.task.apply(
            args=(poison,),
            routing_key=QUEUE,
            headers={"platform_attempt": 1, UNIQUE_HEADER: "nightly-sync"},
        )
        assert result.state == "FAILURE"
        assert harness.rows(
            "SELECT reason FROM core.dead_letters WHERE job_id = %s", str(first)
        ) == [("poison",)]
        again = port.publish(QUEUE, good, unique_key="nightly-sync", unique_for=window)
    finally:
        port.close()
    assert again != first  # a new job: the dead-lettered one's key was freed
