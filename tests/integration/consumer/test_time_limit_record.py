"""The record a hard time limit leaves, and how the redelivery settles it (real Redis, PG).

The end-to-end test (``tests/e2e/consumer/test_time_limits.py``) lets a real prefork pool
kill the attempt; here the worker's main process's part (:func:`record_stop`) runs against
real servers, then a redelivery of the job is applied in process, so the arithmetic of the
attempt it settles, and the fallback when Redis refuses the record, are checked exactly.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import redis

from platform_tasks.consumer.time_limits import record_stop
from platform_tasks.keys import delay_keys, delivery_keys
from platform_tasks.settings import PlatformSettings
from tests.conftest import ServerFactory
from tests.integration.consumer.conftest import MAX_ATTEMPTS, Harness
from tests.integration.consumer.test_attempts import CONSUMER, redeliver
from tests.integration.consumer.test_idempotency import envelope


def request_for(payload: dict[str, Any]) -> Any:
    """What :func:`record_stop` reads of Celery's request: the arguments and delivery info."""
    return SimpleNamespace(args=[payload], delivery_info={"routing_key": "consumer"})


def test_a_recorded_stop_is_settled_as_a_failed_attempt_without_running_the_handler(
    harness: Harness, redis_client: redis.Redis
) -> None:
    payload = envelope("stopped")
    key = delivery_keys("test").deliveries(CONSUMER, payload["job_id"])
    assert record_stop(harness.task, request_for(payload), 3.0)
    assert redis_client.hget(key, "t") == b"3.0"
    assert redeliver(harness, payload).state == "RETRY"
    assert harness.calls == [], "the stopped attempt is settled, not run again"
    # the redelivery counted for the stop became attempt 1's failure; the retry is attempt 2
    assert redis_client.hmget(key, "c", "f", "t") == [b"0", b"1", None]
    (entry,) = redis_client.hvals(delay_keys("test").entries)
    assert json.loads(json.loads(entry)["m"])["headers"]["platform_attempt"] == 2


def test_a_stop_of_the_last_attempt_is_a_dead_letter_naming_the_time_limit(
    harness: Harness, redis_client: redis.Redis
) -> None:
    payload = envelope("stopped-last")
    key = delivery_keys("test").deliveries(CONSUMER, payload["job_id"])
    redis_client.hset(key, "f", MAX_ATTEMPTS - 1)  # attempts 1 and 2 failed before
    assert record_stop(harness.task, request_for(payload), 2.5)
    assert redeliver(harness, payload, attempt=MAX_ATTEMPTS).state == "FAILURE"
    assert harness.calls == []
    ((reason, attempts, error_type, last_error),) = harness.rows(
        "SELECT reason, attempts, error_type, last_error FROM core.dead_letters"
    )
    assert (reason, attempts) == ("retries_exhausted", MAX_ATTEMPTS)
    assert error_type == "platform_tasks.errors.HardTimeLimitExceeded"
    assert f"attempt {MAX_ATTEMPTS} was stopped at its hard time limit of 2.5s" in last_error
    assert harness.rows("SELECT count(*) FROM core.processed_jobs") == [(0,)]


def test_a_first_delivery_does_not_settle_another_copy_s_stop(
    harness: Harness, redis_client: redis.Redis
) -> None:
    """Only the requeued copy (redelivered) settles the stop; a first delivery runs."""
    payload = envelope("published-twice")
    assert record_stop(harness.task, request_for(payload), 3.0)
    assert harness.apply(payload).state == "SUCCESS"
    assert harness.calls == [payload["job_id"]]


def test_when_redis_refuses_the_record_the_stop_counts_as_a_crash(
    harness: Harness,
    server_factory: ServerFactory,
    settings: PlatformSettings,
    redis_client: redis.Redis,
) -> None:
    """The main process's one try fails fast; the requeued copy is then a crash redelivery:
    it runs again (and would end as a crash-loop dead letter), it is not lost."""
    payload = envelope("unrecorded")
    key = delivery_keys("test").deliveries(CONSUMER, payload["job_id"])
    gone = server_factory.redis()
    gone.stop()
    app = harness.task.app
    app.platform_settings = settings.model_copy(update={"redis_url": gone.url})
    try:
        assert not record_stop(harness.task, request_for(payload), 3.0)
    finally:
        app.platform_settings = settings
    assert redis_client.exists(key) == 0
    assert redeliver(harness, payload).state == "SUCCESS"
    assert harness.calls == [payload["job_id"]]
    assert harness.rows("SELECT count(*) FROM core.dead_letters") == [(0,)]
