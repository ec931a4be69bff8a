"""The pipeline's decisions, with small in-memory collaborators at its seams.

The database seam is a connection whose cursor understands the few statements the
pipeline sends (the claim, ``COMMIT``, ``ROLLBACK``, the latest-dead-letter read) and
keeps PostgreSQL's transaction states, including "aborted: COMMIT answers ROLLBACK". The
integration tests run the same paths against the real servers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery.exceptions import Retry
from psycopg2.extensions import (
    TRANSACTION_STATUS_IDLE,
    TRANSACTION_STATUS_INERROR,
    TRANSACTION_STATUS_INTRANS,
)

from platform_tasks.consumer.attempts import DeliveryState
from platform_tasks.consumer.delivery import Delivery
from platform_tasks.consumer.hooks import Hooks, PipelineHook
from platform_tasks.consumer.pipeline import DeliveryPipeline
from platform_tasks.consumer.retry import RetryPolicy
from platform_tasks.consumer.verdicts import (
    Applied,
    Duplicate,
    GaveUp,
    RetryAt,
    ThrottledUntil,
    Wait,
)
from platform_tasks.envelope import parse_envelope, uuid7
from platform_tasks.errors import PermanentError, Throttled, TransactionBroken

NOW = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = RetryPolicy(
    max_attempts=3, base=timedelta(seconds=30), cap=timedelta(seconds=60), rationale="unit tests"
)


class Cursor:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.closed = False
        self.statusmessage: str | None = None
        self._row: Any = None

    def execute(self, sql: str, params: Any = None) -> None:
        conn = self.conn
        sql = "\n".join(line for line in sql.splitlines() if not line.startswith("--"))
        if "platform_cancel_rules" in sql or "FROM core.cancel_rules" in sql:
            self._rows: list[Any] = []  # the cancel check's read: no operator cancels here
            return
        # the dead-letter write (which also queues the row for the alert sender) is an INSERT
        dead_letter_write = sql.startswith("WITH written AS") and "core.dead_letters" in sql
        if dead_letter_write:
            conn.statements.append("INSERT")
        else:
            conn.statements.append(sql.split()[0] if not sql.startswith("BEGIN;") else "CLAIM")
        if sql.startswith(
            (
                "BEGIN; INSERT INTO core.processed_jobs",
                "BEGIN; SELECT claimed, marked FROM core.claim_delivery",
            )
        ):
            job = params["job"] if isinstance(params, dict) else params[0]
            conn.status = TRANSACTION_STATUS_INTRANS
            claimed = job not in conn.applied
            if "core.claim_delivery" in sql:  # the claim that also looks for a mark
                self._row = (claimed, conn.marked)
            else:
                self._row = (1,) if claimed else None
            conn.claimed = job
        elif sql == "COMMIT":
            aborted = conn.status == TRANSACTION_STATUS_INERROR
            self.statusmessage = "ROLLBACK" if aborted else "COMMIT"
            if not aborted and conn.claimed:
                conn.applied.add(conn.claimed)
            conn.status, conn.claimed = TRANSACTION_STATUS_IDLE, None
        elif sql == "ROLLBACK":
            conn.status, conn.claimed = TRANSACTION_STATUS_IDLE, None
        elif sql == "BEGIN":
            conn.status = TRANSACTION_STATUS_INTRANS
        elif sql.startswith("UPDATE core.processed_jobs SET output"):
            conn.outputs.append(params["output"])  # the handler's recorded output
        elif sql.startswith("SELECT id, status FROM core.dead_letters"):
            self._row = conn.latest_dead_letter
        elif dead_letter_write:
            conn.dead_letters.append(params)
            self._row = (100 + len(conn.dead_letters),)
        else:
            raise AssertionError(f"unexpected statement {sql}")

    def fetchone(self) -> Any:
        return self._row

    def fetchall(self) -> list[Any]:
        return self._rows

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Connection:
    applied: set[str] = field(default_factory=set)
    statements: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    status: int = TRANSACTION_STATUS_IDLE
    claimed: str | None = None
    closed: int = 0
    latest_dead_letter: Any = None
    dead_letters: list[Any] = field(default_factory=list)
    marked: bool = True
    """What the claim answers about a delivery mark (set: the counter's state is read)."""

    @property
    def info(self) -> Any:
        return SimpleNamespace(transaction_status=self.status)

    def cursor(self) -> Cursor:
        return Cursor(self)


@dataclass
class Database:
    conn: Connection = field(default_factory=Connection)
    discarded: int = 0

    def connection(self) -> Connection:
        return self.conn

    def discard(self) -> None:
        self.discarded += 1


@dataclass
class Counter:
    state: DeliveryState = field(default_factory=DeliveryState)
    failures: int = 0
    refuse_writes: bool = False
    calls: list[str] = field(default_factory=list)
    """Redis calls and marks, in order (the marks share this list)."""

    def observe(
        self, consumer: str, job_id: str, *, redelivered: bool, ttl_seconds: int
    ) -> DeliveryState:
        self.calls.append("observe")
        return self.state

    def failed(self, consumer: str, job_id: str, *, ttl_seconds: int) -> None:
        if self.refuse_writes:
            raise redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
        self.calls.append("failed")
        self.failures += 1

    def undo(self, consumer: str, job_id: str) -> None: ...
    def exhaust(self, consumer: str, job_id: str, *, ttl_seconds: int) -> None:
        self.calls.append("exhaust")

    def forget(self, consumer: str, job_id: str) -> None: ...


@dataclass
class Marks:
    calls: list[str]
    database: Database = field(default_factory=Database)
    """The marks' own connection: a failed handler's dead letter is written on it."""

    def mark(self, consumer: str, job_id: str) -> None:
        self.calls.append("mark")


@dataclass
class Port:
    refusals: int = 0
    scheduled: list[tuple[str, datetime, dict[str, Any]]] = field(default_factory=list)

    def schedule(self, queue: str, payload: Any, run_at: datetime, opts: dict[str, Any]) -> None:
        if self.refusals:
            self.refusals -= 1
            raise redis.ResponseError("MISCONF Redis is configured to save RDB snapshots")
        self.scheduled.append((queue, run_at, opts))


class Recorder(PipelineHook):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_retry_scheduled(self, *args: Any) -> None:
        self.calls.append("retry")

    def on_throttled(self, *args: Any) -> None:
        self.calls.append("throttled")


def app() -> Any:
    settings = SimpleNamespace(
        visibility_timeout_seconds=300,
        max_payload_bytes=1 << 18,
        job_status=False,  # no running marker: these decisions are about PostgreSQL and counts
        job_output_max_bytes=16_384,
    )
    return SimpleNamespace(
        platform_settings=settings,
        retry_policy_for=lambda queue: POLICY,
        conf=SimpleNamespace(task_default_queue="default"),
        amqp=SimpleNamespace(queues={}),
    )


def task(execute: Callable[[Any, Any], Any]) -> Any:
    return SimpleNamespace(
        name="tests.unit.step", execute=execute, permanent_errors=(), data_model=dict
    )


@dataclass
class Setup:
    pipeline: DeliveryPipeline
    database: Database
    counter: Counter
    port: Port
    hook: Recorder
    sleeps: list[float]


def setup() -> Setup:
    database, counter, port, hook, sleeps = Database(), Counter(), Port(), Recorder(), []
    pipeline = DeliveryPipeline(
        app(),
        database,
        counter,
        hooks=Hooks([hook]),  # type: ignore[arg-type]
        clock=lambda: NOW,
        sleep=sleeps.append,
        port=port,  # type: ignore[arg-type]
        marks=Marks(counter.calls),
        skip_unmarked_reads=True,
    )  # type: ignore[arg-type]
    return Setup(pipeline, database, counter, port, hook, sleeps)


def envelope() -> Any:
    return parse_envelope(
        {
            "job_id": str(uuid7()),
            "tenant_id": "t1",
            "correlation_id": "c1",
            "kind": "tests.unit.step",
            "data": {},
        }
    )


def delivery(attempt: int = 1) -> Delivery:
    return Delivery(consumer="tests.unit.step", queue="q", header_attempt=attempt, priority=None)


def no_transaction_left(s: Setup) -> bool:
    return s.database.conn.status == TRANSACTION_STATUS_IDLE


def test_a_handler_that_returns_is_applied_and_committed() -> None:
    s = setup()
    verdict = s.pipeline.decide(task(lambda env, tx: "ok"), envelope(), delivery())
    assert verdict == Applied(1, "ok", tracked=False)
    # the return value is recorded in the job's transaction, before its commit
    assert s.database.conn.statements == ["CLAIM", "UPDATE", "COMMIT"]
    assert s.database.conn.outputs == ['"ok"']


def test_a_handler_that_returns_none_records_no_output() -> None:
    s = setup()
    verdict = s.pipeline.decide(task(lambda env, tx: None), envelope(), delivery())
    assert verdict == Applied(1, None, tracked=False)
    assert s.database.conn.statements == ["CLAIM", "COMMIT"]


def test_a_first_delivery_without_a_mark_reads_nothing_from_redis() -> None:
    s = setup()
    s.database.conn.marked = False
    s.counter.state = DeliveryState(spent=2)  # not read: an unmarked job has no Redis state
    verdict = s.pipeline.decide(task(lambda env, tx: "ok"), envelope(), delivery())
    assert verdict == Applied(1, "ok", tracked=False)
    assert s.counter.calls == [] and s.database.conn.statements == ["CLAIM", "UPDATE", "COMMIT"]


def test_without_skipping_every_first_delivery_reads_redis() -> None:
    """The platform's Redis is not the broker: its outage must hold every delivery."""
    s = setup()
    s.pipeline.skip_unmarked_reads = False
    s.database.conn.marked = False
    s.pipeline.decide(task(lambda env, tx: "ok"), envelope(), delivery())
    assert s.counter.calls == ["observe"]


def test_a_marked_first_delivery_reads_its_state_from_redis() -> None:
    s = setup()
    s.counter.state = DeliveryState(spent=1, tracked=True)
    verdict = s.pipeline.decide(task(lambda env, tx: "ok"), envelope(), delivery())
    assert verdict == Applied(2, "ok", tracked=True) and s.counter.calls == ["observe"]


def test_a_redelivery_is_marked_before_it_is_counted_even_without_a_mark() -> None:
    s = setup()
    s.database.conn.marked = False
    redelivered = Delivery(
        consumer="tests.unit.step", queue="q", header_attempt=1, priority=None, redelivered=True
    )
    s.pipeline.decide(task(lambda env, tx: "ok"), envelope(), redelivered)
    assert s.counter.calls == ["mark", "observe"]


def test_a_failed_attempt_is_marked_before_it_is_counted() -> None:
    s = setup()
    s.database.conn.marked = False
    verdict = s.pipeline.decide(task(fail(RuntimeError("x"))), envelope(), delivery())
    assert isinstance(verdict, RetryAt) and s.counter.calls == ["mark", "failed"]


def test_a_job_already_applied_is_a_duplicate_and_nothing_runs() -> None:
    s = setup()
    env = envelope()
    s.database.conn.applied.add(str(env.job_id))
    ran: list[int] = []
    verdict = s.pipeline.decide(task(lambda e, tx: ran.append(1)), env, delivery())
    assert verdict == Duplicate("applied") and ran == [] and no_transaction_left(s)


def fail(exc: BaseException) -> Callable[[Any, Any], Any]:
    def execute(env: Any, tx: Any) -> Any:
        raise exc

    return execute


def test_a_failed_attempt_is_counted_rolled_back_and_retried_with_backoff() -> None:
    s = setup()
    verdict = s.pipeline.decide(task(fail(RuntimeError("x"))), envelope(), delivery())
    assert isinstance(verdict, RetryAt) and verdict.attempt == 1
    assert timedelta(seconds=15) <= verdict.at - NOW <= timedelta(seconds=30)
    assert s.counter.failures == 1 and s.database.conn.statements[-1] == "ROLLBACK"


def test_the_last_attempt_and_a_permanent_error_are_dead_letters() -> None:
    s = setup()
    last = s.pipeline.decide(task(fail(RuntimeError("x"))), envelope(), delivery(attempt=3))
    assert isinstance(last, GaveUp) and last.record.reason == "retries_exhausted"
    assert last.row == 101 and last.record.attempts == 3  # written while the claim held
    permanent = s.pipeline.decide(task(fail(PermanentError("no"))), envelope(), delivery())
    assert isinstance(permanent, GaveUp) and permanent.record.reason == "permanent_error"
    assert no_transaction_left(s)


def test_a_failed_handlers_dead_letter_is_written_before_its_claim_is_released() -> None:
    """A copy waiting on the claim must find the row, not the job free to run again."""
    s = setup()
    order: list[str] = []
    s.database.conn.statements = Recorded(order, "job")  # type: ignore[assignment]
    beside = s.pipeline.marks.database.conn  # type: ignore[attr-defined]
    beside.statements = Recorded(order, "beside")
    verdict = s.pipeline.decide(task(fail(PermanentError("no"))), envelope(), delivery())
    assert isinstance(verdict, GaveUp) and verdict.row == 101 and not verdict.claim
    assert order == [
        "job CLAIM",
        "beside BEGIN",
        "beside SELECT",
        "beside INSERT",
        "beside COMMIT",
        "job ROLLBACK",
    ]
    assert s.counter.calls[-2:] == ["mark", "exhaust"]  # the budget is spent before, too
    assert no_transaction_left(s) and beside.status == TRANSACTION_STATUS_IDLE


def test_a_failed_copy_of_a_job_with_a_dead_letter_pending_is_a_duplicate() -> None:
    s = setup()
    beside = s.pipeline.marks.database.conn  # type: ignore[attr-defined]
    beside.latest_dead_letter = (7, "pending_review")
    verdict = s.pipeline.decide(task(fail(PermanentError("no"))), envelope(), delivery())
    assert verdict == Duplicate("dead_lettered", 7) and beside.dead_letters == []
    beside.latest_dead_letter = (7, "replayed")  # a replay's failure is a new dead letter
    verdict = s.pipeline.decide(task(fail(PermanentError("no"))), envelope(), delivery())
    assert isinstance(verdict, GaveUp) and len(beside.dead_letters) == 1


class Recorded(list[str]):
    """A connection's statements, also appended to one order shared by two connections."""

    def __init__(self, order: list[str], name: str) -> None:
        super().__init__()
        self.order, self.name = order, name

    def append(self, statement: str) -> None:
        super().append(statement)
        self.order.append(f"{self.name} {statement}")


def test_throttled_reschedules_the_same_attempt_without_counting_a_failure() -> None:
    s = setup()
    at = NOW + timedelta(seconds=5)
    verdict = s.pipeline.decide(
        task(fail(Throttled(at, "provider_429"))), envelope(), delivery(attempt=2)
    )
    assert verdict == ThrottledUntil(at, 2, "provider_429")
    assert s.counter.failures == 0 and no_transaction_left(s)


def test_a_redis_refusal_while_counting_waits_and_leaves_no_transaction_open() -> None:
    s = setup()
    s.counter.refuse_writes = True
    verdict = s.pipeline.decide(task(fail(RuntimeError("x"))), envelope(), delivery())
    assert isinstance(verdict, Wait) and "OOM" in verdict.cause
    assert no_transaction_left(s) or s.database.discarded


def abort(env: Any, tx: Any) -> None:
    tx.conn.status = TRANSACTION_STATUS_INERROR  # a statement failed; the handler went on


def test_a_commit_that_cannot_commit_is_a_failed_attempt() -> None:
    s = setup()
    verdict = s.pipeline.decide(task(abort), envelope(), delivery())
    assert isinstance(verdict, RetryAt) and isinstance(verdict.error, TransactionBroken)
    assert s.database.conn.applied == set()


def test_a_closed_cursor_is_a_failed_attempt_not_an_outage() -> None:
    s = setup()
    verdict = s.pipeline.decide(task(lambda env, tx: tx.close()), envelope(), delivery())
    assert isinstance(verdict, RetryAt) and isinstance(verdict.error, TransactionBroken)
    assert no_transaction_left(s)


def test_whatever_the_handler_raises_the_transaction_ends() -> None:
    s = setup()
    with pytest.raises(KeyboardInterrupt):
        s.pipeline.decide(task(fail(KeyboardInterrupt())), envelope(), delivery())
    assert no_transaction_left(s) and s.database.conn.statements[-1] == "ROLLBACK"


def test_a_job_dead_lettered_meanwhile_is_not_run_again() -> None:
    s = setup()
    s.counter.state = DeliveryState(exhausted=True, tracked=True)
    s.database.conn.latest_dead_letter = (7, "pending_review")
    ran: list[int] = []
    verdict = s.pipeline.decide(task(lambda e, tx: ran.append(1)), envelope(), delivery())
    assert verdict == Duplicate("dead_lettered", 7) and ran == []


def test_settling_a_retry_waits_until_it_is_stored_and_never_returns_before() -> None:
    s = setup()
    s.port.refusals = 2
    at = NOW + timedelta(seconds=20)
    with pytest.raises(Retry):
        s.pipeline.settle(
            task(lambda e, tx: None), delivery(), envelope(), RetryAt(at, 1, RuntimeError("x"))
        )
    why = {"platform_delay_reason": {"why": "retry", "max": 3}}  # for jobs show
    assert s.port.scheduled == [("q", at, {"attempt": 2, "headers": why})]
    assert len(s.sleeps) == 2 and s.hook.calls == ["retry"]


def test_settling_throttled_keeps_the_attempt_and_tells_the_hooks() -> None:
    s = setup()
    at = NOW + timedelta(seconds=20)
    with pytest.raises(Retry):
        s.pipeline.settle(
            task(lambda e, tx: None),
            delivery(),
            envelope(),
            ThrottledUntil(at, 2, "tenant_rate_limit"),
        )
    why = {"platform_delay_reason": {"why": "throttle", "detail": "tenant_rate_limit"}}
    assert s.port.scheduled == [("q", at, {"attempt": 2, "headers": why})]
    assert s.hook.calls == ["throttled"]


def test_reads_are_skipped_when_the_platform_redis_is_the_broker_or_on_rabbitmq() -> None:
    from platform_tasks.consumer.marks import reads_can_skip
    from platform_tasks.settings import PlatformSettings

    url = "redis://127.0.0.1:6390/0"
    assert reads_can_skip(PlatformSettings.build(redis_url=url))
    assert not reads_can_skip(
        PlatformSettings.build(redis_url=url, broker_url="redis://127.0.0.1:6391/0")
    )
    assert not reads_can_skip(
        PlatformSettings.build(
            redis_url=url, redis_cluster=True, broker_url="redis://127.0.0.1:6391/0"
        )
    )
    # RabbitMQ sets `redelivered` itself: a first delivery without a mark needs no Redis
    assert reads_can_skip(
        PlatformSettings.build(redis_url=url, broker_url="amqp://u:p@127.0.0.1:5672/v")
    )
    assert reads_can_skip(
        PlatformSettings.build(
            redis_url=url, redis_cluster=True, broker_url="amqp://u:p@127.0.0.1:5672/v"
        )
    )


def test_a_gate_with_a_verdict_ends_the_delivery_before_later_gates_and_the_handler() -> None:
    s = setup()
    seen: list[str] = []

    def answers(pipeline: Any, run: Any) -> Any:
        seen.append("answers")
        return Duplicate("cancelled")

    def later(pipeline: Any, run: Any) -> Any:
        seen.append("later")
        return None

    s.pipeline.gates = (answers, later)
    verdict = s.pipeline.decide(
        task(lambda env, tx: seen.append("handler")), envelope(), delivery()
    )
    assert verdict == Duplicate("cancelled") and seen == ["answers"]
    assert s.database.conn.statements == ["CLAIM", "ROLLBACK"] and no_transaction_left(s)


def test_a_gate_that_raises_makes_the_delivery_wait_and_never_runs_the_handler() -> None:
    s = setup()
    ran: list[str] = []

    def broken(pipeline: Any, run: Any) -> Any:
        raise KeyError("a bug in a pre-run check")

    s.pipeline.gates = (broken,)
    verdict = s.pipeline.decide(task(lambda env, tx: ran.append("handler")), envelope(), delivery())
    assert isinstance(verdict, Wait) and not verdict.outage and ran == []
    assert no_transaction_left(s) and s.database.discarded == 1
