"""Retries, dead letters and poison envelopes, against the real Redis and PostgreSQL."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import redis

from platform_tasks import PermanentError, PlatformTask
from platform_tasks.errors import ConfigurationError, DeadLettered
from platform_tasks.keys import delay_keys
from tests.integration.consumer.conftest import MAX_ATTEMPTS, QUEUE, Harness
from tests.integration.consumer.test_idempotency import envelope

DEAD_LETTER_COLUMNS = (
    "job_id::text, queue, kind, tenant_id, payload, attempts, last_error, error_type, reason, "
    "status, correlation_id"
)


def dead_letters(harness: Harness) -> list[tuple[Any, ...]]:
    return harness.rows(f"SELECT {DEAD_LETTER_COLUMNS} FROM core.dead_letters ORDER BY id")


def test_failed_attempt_is_rescheduled_in_the_delay_store_with_next_attempt(
    harness: Harness, redis_client: redis.Redis
) -> None:
    payload = envelope("retry-me", fail=True)
    result = harness.apply(payload, attempt=1)
    assert result.state == "RETRY"
    keys = delay_keys("test")
    assert redis_client.zcard(keys.schedule) == 1
    (entry,) = redis_client.hvals(keys.entries)
    wire = json.loads(json.loads(entry)["m"])
    assert wire["headers"]["platform_attempt"] == 2
    assert wire["headers"]["id"] == payload["job_id"]
    assert wire["headers"]["task"] == "tests.it.apply"
    # backoff for attempt 1 with base 30 s: within [15 s, 30 s] from now
    (due_ms,) = [score for _, score in redis_client.zrange(keys.schedule, 0, 0, withscores=True)]
    seconds, micros = redis_client.time()  # whole seconds alone would be up to 1 s early
    now_ms = seconds * 1000 + micros / 1000
    assert 14_000 <= due_ms - now_ms <= 30_500
    assert dead_letters(harness) == []


def test_last_attempt_failing_is_dead_lettered_with_error_details(
    harness: Harness, redis_client: redis.Redis
) -> None:
    payload = envelope("tired", fail=True)
    result = harness.apply(payload, attempt=MAX_ATTEMPTS)
    assert result.state == "FAILURE"
    assert redis_client.zcard(delay_keys("test").schedule) == 0
    (row,) = dead_letters(harness)
    job_id, queue, kind, tenant, stored, attempts, last_error, error_type, reason, status, corr = (
        row
    )
    assert (job_id, queue, kind, tenant, corr) == (
        payload["job_id"],
        "consumer",
        "tests.it.apply",
        "tenant-1",
        "corr-1",
    )
    assert stored == payload
    assert attempts == MAX_ATTEMPTS
    assert reason == "retries_exhausted" and status == "pending_review"
    assert error_type == "RuntimeError"
    assert last_error.startswith("RuntimeError: transient trouble")
    assert "Traceback (most recent call last)" in last_error
    assert harness.rows("SELECT count(*) FROM core.processed_jobs") == [(0,)]


def test_permanent_error_is_dead_lettered_at_first_attempt(harness: Harness) -> None:
    payload = envelope("never", permanent=True)
    assert harness.apply(payload).state == "FAILURE"
    (row,) = dead_letters(harness)
    assert row[5] == 1 and row[8] == "permanent_error"
    assert row[7] == "platform_tasks.errors.PermanentError"
    # a later duplicate of the dead-lettered job is not run again
    assert harness.apply(payload).state == "SUCCESS"
    assert harness.calls == [payload["job_id"]]
    assert len(dead_letters(harness)) == 1


def test_poison_envelope_is_dead_lettered_at_once_and_never_handled(harness: Harness) -> None:
    payload = {
        "job_id": "not-a-uuid",
        "tenant_id": "bad tenant!",
        "correlation_id": "c",
        "kind": "tests.it.apply",
        "data": {"no_key": 1},
    }
    result = harness.apply(payload)
    assert result.state == "FAILURE"
    assert harness.calls == []
    (row,) = dead_letters(harness)
    job_id, queue, kind, tenant, stored, attempts, last_error, error_type, reason, status, _ = row
    assert job_id is None and tenant == "bad tenant!"  # readable text is kept for filtering
    assert (queue, kind, error_type) == (
        "consumer",
        "tests.it.apply",
        "platform_tasks.errors.EnvelopeError",
    )
    assert stored == payload
    assert reason == "poison" and status == "pending_review" and attempts == 1
    for field in ("job_id", "tenant_id", "data.key"):
        assert field in last_error, last_error


def test_unknown_platform_option_is_rejected_at_declaration(harness: Harness) -> None:
    with pytest.raises(ConfigurationError, match="unknown task option 'data_modle'"):

        @harness.app.task(
            name="tests.it.typo", base=PlatformTask, data_modle=dict, lazy=False, shared=False
        )
        def typo(envelope: Any, tx: Any) -> None: ...


def test_celery_autoretry_is_rejected_at_declaration(harness: Harness) -> None:
    with pytest.raises(ConfigurationError, match="autoretry_for"):

        @harness.app.task(
            name="tests.it.auto",
            base=PlatformTask,
            autoretry_for=(Exception,),
            lazy=False,
            shared=False,
        )
        def auto(envelope: Any, tx: Any) -> None: ...


def test_data_model_must_be_a_model(harness: Harness) -> None:
    with pytest.raises(ConfigurationError, match="data_model"):

        @harness.app.task(
            name="tests.it.model", base=PlatformTask, data_model=42, lazy=False, shared=False
        )
        def model(envelope: Any, tx: Any) -> None: ...


CELERY_OPTIONS: dict[str, Any] = {
    "queue": "billing",
    "routing_key": "billing.charge",
    "exchange": "billing",
    "priority": 5,
    "time_limit": 60,
    "soft_time_limit": 30,
    "rate_limit": "10/s",
    "ignore_result": True,
    "acks_late": True,
    "expires": 3600,
    "serializer": "json",
    "track_started": True,
    "reject_on_worker_lost": True,
    "store_errors_even_if_ignored": False,
}


def test_celery_task_options_keep_their_meaning_on_a_platform_task(harness: Harness) -> None:
    @harness.app.task(
        name="billing.charge", base=PlatformTask, lazy=False, shared=False, **CELERY_OPTIONS
    )
    def charge(envelope: Any, tx: Any) -> None: ...

    for option, value in CELERY_OPTIONS.items():
        assert getattr(charge, option) == value, option
    assert charge._get_exec_options()["queue"] == "billing"


@pytest.mark.parametrize("option", ["max_retries", "default_retry_delay", "retry_backoff"])
def test_retry_options_the_platform_owns_stay_refused_with_the_reason(
    harness: Harness, option: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"{option}.*RetryPolicy"):

        @harness.app.task(
            name=f"tests.it.{option}", base=PlatformTask, lazy=False, shared=False, **{option: 3}
        )
        def refused(envelope: Any, tx: Any) -> None: ...


def test_a_subclass_declares_the_options_it_owns(harness: Harness) -> None:
    class ChannelTask(PlatformTask):
        platform_options = PlatformTask.platform_options | {"channel"}
        channel: str = "email"

    @harness.app.task(
        name="tests.it.channel", base=ChannelTask, channel="sms", lazy=False, shared=False
    )
    def send(envelope: Any, tx: Any) -> None: ...

    assert send.channel == "sms"
    with pytest.raises(ConfigurationError, match="unknown task option 'channel'"):

        @harness.app.task(
            name="tests.it.nochannel", base=PlatformTask, channel="sms", lazy=False, shared=False
        )
        def plain(envelope: Any, tx: Any) -> None: ...


def test_dead_lettered_is_an_expected_error_for_celery_and_sentry(harness: Harness) -> None:
    assert DeadLettered in harness.task.throws


def test_a_dead_letter_keeps_the_payload_as_received_when_the_handler_changed_it(
    harness: Harness,
) -> None:
    """With ``data_model=dict`` the values nested in ``data`` are the message's own objects;
    a handler that changes them in place and fails must not change what replay gets."""

    @harness.app.task(name="tests.it.meddle", base=PlatformTask, shared=False)
    def meddle(envelope: Any, tx: Any) -> None:
        envelope.data["order"]["lines"].append({"sku": "added-by-handler"})
        envelope.data["order"]["total"] = 0
        raise PermanentError("cannot ever work")

    payload = {
        **envelope("meddled"),
        "kind": "tests.it.meddle",
        "data": {"order": {"lines": [{"sku": "a-1"}], "total": 12}},
    }
    as_sent = copy.deepcopy(payload)
    result = meddle.apply(args=(payload,), routing_key=QUEUE)
    assert result.state == "FAILURE"
    (row,) = dead_letters(harness)
    assert row[4] == as_sent
