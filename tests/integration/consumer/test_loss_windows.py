"""Loss windows of one delivery, each reproduced against the real Redis and PostgreSQL.

Every test runs the real pipeline in this process (``task.apply``) with the process's
one cached PostgreSQL connection, so "the next job in the same pool process" is the next
``apply`` here. A delivery that must *wait* runs in a daemon thread: the test watches the
``consumer.waiting_for_servers`` log line, repairs the server, and then expects the
delivery to settle.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg2
import pytest
import redis
from prometheus_client import REGISTRY
from pydantic import BaseModel

from platform_tasks import PlatformTask, RetryPolicy, create_app
from platform_tasks.app import PlatformCelery
from platform_tasks.envelope import uuid7
from platform_tasks.keys import delay_keys
from platform_tasks.settings import PlatformSettings
from platform_tasks.testing.servers import wait_until
from tests.conftest import ServerFactory

QUEUE = "losses"
MAX_ATTEMPTS = 3
SETTLE_TIMEOUT = 60.0


class Step(BaseModel):
    key: str
    fail: bool = False
    swallow_sql_error: bool = False
    close_cursor: bool = False
    close_connection: bool = False
    end_transaction: bool = False


@dataclass
class Pipeline:
    app: PlatformCelery
    task: Any
    database_url: str
    calls: list[str] = field(default_factory=list)

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        conn = psycopg2.connect(self.database_url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall())
        finally:
            conn.close()

    def apply(self, payload: Any, *, attempt: int = 1, queue: str = QUEUE) -> Any:
        return self.task.apply(
            args=(payload,), routing_key=queue, headers={"platform_attempt": attempt}
        )


def payload(key: str, **data: Any) -> dict[str, Any]:
    return {
        "job_id": str(uuid7()),
        "tenant_id": "tenant-1",
        "correlation_id": "corr-1",
        "kind": "tests.losses.step",
        "data": {"key": key, **data},
    }


def build(settings: PlatformSettings) -> Pipeline:
    conn = psycopg2.connect(settings.database_url)
    with conn, conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE IF NOT EXISTS public.loss_work (job_id uuid NOT NULL, key text NOT NULL)"
        )
        cur.execute("TRUNCATE public.loss_work")
    conn.close()
    app = create_app(
        "losses_it",
        settings=settings,
        retry_policies={
            QUEUE: RetryPolicy(
                max_attempts=MAX_ATTEMPTS,
                base=timedelta(seconds=30),
                cap=timedelta(seconds=60),
                rationale="tests: three attempts are enough to see the accounting",
            )
        },
    )
    box: dict[str, Pipeline] = {}

    @app.task(name="tests.losses.step", base=PlatformTask, data_model=Step, shared=False)
    def step(envelope: Any, tx: Any) -> str:
        box["p"].calls.append(str(envelope.job_id))
        data = envelope.data
        tx.execute(
            "INSERT INTO public.loss_work (job_id, key) VALUES (%s, %s)",
            (str(envelope.job_id), data.key.replace("\x00", "")),
        )
        if data.swallow_sql_error:
            # the handler "handles" it; the transaction is aborted all the same
            with contextlib.suppress(psycopg2.Error):
                tx.execute("SELECT * FROM public.no_such_table")
        if data.close_cursor:
            tx.close()
        if data.close_connection:
            tx.connection.close()
        if data.end_transaction:
            tx.execute("ROLLBACK")
        if data.fail:
            raise RuntimeError("transient trouble")
        return "done"

    pipeline = Pipeline(app=app, task=step, database_url=str(settings.database_url))
    box["p"] = pipeline
    return pipeline


@pytest.fixture
def pipeline(settings: PlatformSettings) -> Iterator[Pipeline]:
    p = build(settings)
    yield p
    p.app.close()


def dead_letters(p: Pipeline) -> list[tuple[Any, ...]]:
    return p.rows(
        "SELECT job_id::text, reason, attempts, correlation_id, payload FROM core.dead_letters "
        "ORDER BY id"
    )


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` in a daemon thread (one that never ends must not hang the test run)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # reported by the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def settled(thread: threading.Thread, box: dict[str, Any]) -> Any:
    thread.join(SETTLE_TIMEOUT)
    assert not thread.is_alive(), "the delivery never settled"
    assert "error" not in box, repr(box.get("error"))
    return box["result"]


def assert_next_job_applies(p: Pipeline) -> None:
    healthy = payload("healthy")
    result = p.apply(healthy)
    assert result.state == "SUCCESS", result.traceback
    assert p.rows("SELECT job_id::text, key FROM public.loss_work") == [
        (healthy["job_id"], "healthy")
    ]
    assert p.rows("SELECT job_id::text FROM core.processed_jobs") == [(healthy["job_id"],)]


# -- 1. NUL characters --------------------------------------------------------------------


def test_nul_in_data_becomes_a_storable_dead_letter_and_the_next_job_applies(
    pipeline: Pipeline,
) -> None:
    bad = payload("a\x00b", fail=True)
    result = pipeline.apply(bad, attempt=MAX_ATTEMPTS)
    assert result.state == "FAILURE"
    ((job_id, reason, attempts, _, stored),) = dead_letters(pipeline)
    # the envelope model refuses NUL (it could not be stored as work either): poison,
    # dead-lettered at once, its payload kept with NUL written out as text
    assert (job_id, reason, attempts) == (bad["job_id"], "poison", 1)
    assert "\x00" not in str(stored)
    assert stored["data"]["key"] == "a\\u0000b"  # the six characters \u0000, not NUL
    assert_next_job_applies(pipeline)


def test_nul_in_correlation_id_becomes_a_storable_dead_letter_and_the_next_job_applies(
    pipeline: Pipeline,
) -> None:
    bad = dict(payload("x", fail=True), correlation_id="c\x00d")
    result = pipeline.apply(bad, attempt=MAX_ATTEMPTS)
    assert result.state == "FAILURE"
    ((job_id, _, _, correlation_id, _),) = dead_letters(pipeline)
    assert job_id == bad["job_id"]
    assert "\x00" not in correlation_id
    assert_next_job_applies(pipeline)


# -- 4, 5. a handler that breaks its transaction ------------------------------------------


def retry_entries(client: redis.Redis) -> int:
    return int(client.zcard(delay_keys("test").schedule))


def test_handler_that_swallows_a_sql_error_is_a_failed_attempt_and_retried(
    pipeline: Pipeline, redis_client: redis.Redis
) -> None:
    result = pipeline.apply(payload("swallowed", swallow_sql_error=True))
    assert result.state == "RETRY"
    assert pipeline.rows("SELECT count(*) FROM core.processed_jobs") == [(0,)]
    assert retry_entries(redis_client) == 1
    assert_next_job_applies(pipeline)


@pytest.mark.parametrize("how", ["close_cursor", "close_connection", "end_transaction"])
def test_handler_that_closes_or_ends_its_transaction_is_a_failed_attempt_with_a_budget(
    pipeline: Pipeline, redis_client: redis.Redis, how: str
) -> None:
    first = payload("closed", **{how: True})
    thread, box = in_thread(lambda: pipeline.apply(first))
    assert settled(thread, box).state == "RETRY"
    assert retry_entries(redis_client) == 1
    assert pipeline.rows("SELECT count(*) FROM core.processed_jobs") == [(0,)]
    # the budget holds: the last attempt is dead-lettered, not rescheduled again
    last = payload("closed-last", **{how: True})
    thread, box = in_thread(lambda: pipeline.apply(last, attempt=MAX_ATTEMPTS))
    assert settled(thread, box).state == "FAILURE"
    assert [row[0] for row in dead_letters(pipeline)] == [last["job_id"]]
    assert_next_job_applies(pipeline)


# -- 2. Redis error replies ---------------------------------------------------------------


class WaitingSeen(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == "consumer.waiting_for_servers":
            self.seen.set()


@pytest.fixture
def waiting() -> Iterator[WaitingSeen]:
    handler = WaitingSeen()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


def wait_while_out_of_memory(thread: threading.Thread, waiting: WaitingSeen) -> None:
    wait_until(
        lambda: waiting.seen.is_set() or not thread.is_alive(),
        timeout=SETTLE_TIMEOUT,
        message="the delivery waits or ends",
    )
    assert thread.is_alive(), "the delivery settled while Redis refused every write"


def test_oom_reply_while_counting_a_failed_attempt_waits_and_never_commits_partial_work(
    pipeline: Pipeline, redis_client: redis.Redis, waiting: WaitingSeen
) -> None:
    failing = payload("partial", fail=True)
    redis_client.config_set("maxmemory", 1)
    try:
        thread, box = in_thread(lambda: pipeline.apply(failing))
        wait_while_out_of_memory(thread, waiting)
    finally:
        redis_client.config_set("maxmemory", 0)
    assert settled(thread, box).state == "RETRY"
    assert retry_entries(redis_client) == 1
    assert_next_job_applies(pipeline)  # the failed job's insert was never committed


def test_oom_reply_while_storing_the_retry_waits_and_then_stores_it(
    settings: PlatformSettings, server_factory: ServerFactory, waiting: WaitingSeen
) -> None:
    broker = server_factory.redis()
    p = build(settings.model_copy(update={"broker_url": broker.url}))
    client = redis.Redis.from_url(broker.url)
    try:
        client.config_set("maxmemory", 1)
        try:
            thread, box = in_thread(lambda: p.apply(payload("retry-later", fail=True)))
            wait_while_out_of_memory(thread, waiting)
        finally:
            client.config_set("maxmemory", 0)
        assert settled(thread, box).state == "RETRY"
        assert retry_entries(client) == 1
        assert dead_letters(p) == []
    finally:
        client.close()
        p.app.close()


# -- 10. metric labels --------------------------------------------------------------------


def poison_labels() -> set[tuple[str, str]]:
    return {
        (sample.labels["queue"], sample.labels["task"])
        for metric in REGISTRY.collect()
        if metric.name == "platform_jobs_poison"
        for sample in metric.samples
        if sample.name == "platform_jobs_poison_total"
    }


def test_metric_labels_come_only_from_declared_queues(pipeline: Pipeline) -> None:
    junk_queue = f"junk-{uuid7()}"
    result = pipeline.apply({"job_id": "nope"}, queue=junk_queue)
    assert result.state == "FAILURE"
    labels = poison_labels()
    assert not any(queue == junk_queue for queue, _ in labels), labels
    assert ("unknown", "tests.losses.step") in labels


# -- the one size rule --------------------------------------------------------------------


def test_consume_applies_the_configured_payload_limit_once(settings: PlatformSettings) -> None:
    """The consumer measures with the envelope's own rule and the current setting."""
    p = build(settings.model_copy(update={"max_payload_bytes": 1024}))
    try:
        big = payload("x" * 2000)
        result = p.apply(big)
        assert result.state == "FAILURE"
        assert p.calls == []
        ((job_id, reason, _, _, _),) = dead_letters(p)
        assert (job_id, reason) == (big["job_id"], "poison")
        small = payload("fits")
        assert p.apply(small).state == "SUCCESS"
    finally:
        p.app.close()
