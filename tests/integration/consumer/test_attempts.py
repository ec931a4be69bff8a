"""Delivery counting in Redis: first deliveries write nothing; redeliveries and failures count."""

from __future__ import annotations

import json
from typing import Any

import redis

from platform_tasks.consumer.attempts import DeliveryCounter
from platform_tasks.keys import delay_keys, delivery_keys, running_key
from tests.integration.consumer.conftest import MAX_ATTEMPTS, Harness
from tests.integration.consumer.test_idempotency import envelope

CONSUMER = "tests.it.apply"
WRITES = ("hincrby", "hset", "expire", "del", "set", "eval", "evalsha")


def write_calls(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in WRITES)


def redeliver(harness: Harness, payload: dict[str, Any], *, attempt: int = 1) -> Any:
    """A delivery as the broker makes it after a worker died: marked ``redelivered``."""
    return harness.task.apply(
        args=(payload,),
        routing_key="consumer",
        headers={"platform_attempt": attempt, "redelivered": True},
    )


def test_first_delivery_of_a_healthy_job_writes_nothing_to_redis(
    harness: Harness, redis_client: redis.Redis
) -> None:
    assert harness.apply(envelope("warm-up")).state == "SUCCESS"  # connections opened
    before = write_calls(redis_client)
    payloads = [envelope(f"quiet-{n}") for n in range(20)]
    for payload in payloads:
        assert harness.apply(payload).state == "SUCCESS"
    # a short job gets no running marker either (only one that runs on: jobs_status)
    assert write_calls(redis_client) == before
    assert redis_client.keys(delivery_keys("test").deliveries("*", "*")) == []
    assert redis_client.keys(running_key("test", "*")) == []
    assert harness.rows("SELECT count(*) FROM core.processed_jobs") == [(21,)]


def test_redelivery_is_counted_as_one_more_attempt(
    harness: Harness, redis_client: redis.Redis
) -> None:
    payload = envelope("crashed-once", fail=True)
    key = delivery_keys("test").deliveries(CONSUMER, payload["job_id"])
    assert redeliver(harness, payload).state == "RETRY"
    # the first delivery died in the handler, this one was attempt 2: the retry is attempt 3
    assert redis_client.hmget(key, "c", "f") == [b"1", b"1"]
    (entry,) = redis_client.hvals(delay_keys("test").entries)
    assert json.loads(json.loads(entry)["m"])["headers"]["platform_attempt"] == 3
    assert redis_client.ttl(key) > 0


def test_redelivered_job_that_applies_clears_its_count(
    harness: Harness, redis_client: redis.Redis
) -> None:
    payload = envelope("crashed-then-fine")
    assert redeliver(harness, payload).state == "SUCCESS"
    assert redis_client.keys(delivery_keys("test").deliveries("*", "*")) == []
    assert harness.calls == [payload["job_id"]]


def test_crash_loop_ends_after_max_attempts_deliveries(
    harness: Harness, redis_client: redis.Redis
) -> None:
    payload = envelope("crash-loop")
    counter = DeliveryCounter(redis_client, delivery_keys("test"))
    # the first delivery and MAX_ATTEMPTS - 1 redeliveries started the handler and died
    for _ in range(MAX_ATTEMPTS - 1):
        counter.observe(CONSUMER, payload["job_id"], redelivered=True, ttl_seconds=600)
    result = redeliver(harness, payload)
    assert result.state == "FAILURE"
    assert harness.calls == []
    ((reason, attempts, last_error),) = harness.rows(
        "SELECT reason, attempts, last_error FROM core.dead_letters"
    )
    assert (reason, attempts) == ("crash_loop", MAX_ATTEMPTS)
    assert "crash loop" in last_error
    assert harness.rows("SELECT count(*) FROM core.processed_jobs") == [(0,)]
    # a duplicate arriving later, as a first delivery, is not run either
    assert harness.apply(payload).state == "SUCCESS"
    assert harness.calls == []
    assert harness.rows("SELECT count(*) FROM core.dead_letters") == [(1,)]


def test_redelivered_retry_after_a_failure_is_the_last_attempt(harness: Harness) -> None:
    """Attempt 1 failed, attempt 2 died in its worker: the redelivery is attempt 3, the last."""
    payload = envelope("late-crash", fail=True)
    assert harness.apply(payload).state == "RETRY"
    assert redeliver(harness, payload, attempt=2).state == "FAILURE"
    ((reason, attempts),) = harness.rows("SELECT reason, attempts FROM core.dead_letters")
    assert (reason, attempts) == ("retries_exhausted", MAX_ATTEMPTS)
    assert harness.calls == [payload["job_id"]] * 2


def test_duplicate_copies_of_a_job_share_one_budget(harness: Harness) -> None:
    """Two publishes of one failing job: MAX_ATTEMPTS runs in all, then one dead letter."""
    payload = envelope("twice-published", fail=True)
    # each copy arrives as a first delivery with attempt header 1
    verdicts = [harness.apply(payload).state for _ in range(MAX_ATTEMPTS + 1)]
    assert verdicts == ["RETRY"] * (MAX_ATTEMPTS - 1) + ["FAILURE", "SUCCESS"]
    assert harness.calls == [payload["job_id"]] * MAX_ATTEMPTS
    ((reason, attempts),) = harness.rows("SELECT reason, attempts FROM core.dead_letters")
    assert (reason, attempts) == ("retries_exhausted", MAX_ATTEMPTS)
