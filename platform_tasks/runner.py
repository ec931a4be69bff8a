"""One delivery of a :class:`~platform_tasks.task.PlatformTask`, from message to verdict.

The order of steps is the guarantee:

1. validate the envelope; invalid → poison dead letter, acked, handler never called;
2. open a transaction and claim ``(job_id, consumer)`` in ``core.processed_jobs`` (the
   ``BEGIN`` travels with the claim: one round trip); a duplicate is skipped (or waits for
   a concurrent delivery of the same job to finish);
3. ask Redis about the job before the handler runs: a redelivery (its worker died) is
   counted there, so crash loops end; a first delivery only reads the attempts already
   spent (by failures, crashes, duplicate copies) and whether the job was dead-lettered
   meanwhile. Past ``max_attempts`` the job is dead-lettered, not run;
4. run the handler in that same transaction and commit: one commit for the idempotency
   row and the work;
5. on failure, count the failed attempt in Redis, roll back and either reschedule
   through the durable delay store (attempt + 1 in the ``platform_attempt`` header) or
   dead-letter in a new transaction that claims the job again first, so a concurrent
   duplicate cannot slip in (and a duplicate that applied the job meanwhile makes the
   dead letter unnecessary).

While PostgreSQL or Redis is unreachable the delivery waits (unacked) and starts over once
they answer; nothing is acked that is not applied, rescheduled or dead-lettered.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg2
import redis
from celery.exceptions import Retry

from platform_tasks import idempotency, metrics
from platform_tasks.alerts import configure_alerts
from platform_tasks.context import current_correlation_id
from platform_tasks.database import (
    Database,
    DatabaseUnavailable,
    commit,
    is_unavailable,
    require_database_url,
    rollback,
)
from platform_tasks.dead_lettering import (
    DeadLetterRecord,
    describe_error,
    error_type_name,
    latest_dead_letter,
    raw_payload,
)
from platform_tasks.deliveries import DeliveryCounter, DeliveryState
from platform_tasks.envelope import Envelope, parse_envelope
from platform_tasks.errors import EnvelopeError, PlatformError, Throttled
from platform_tasks.failure_policy import (
    CRASH_LOOP,
    POISON,
    attempt_number,
    decide,
    delivery_ttl_seconds,
)
from platform_tasks.keys import delivery_keys
from platform_tasks.queue_port import ATTEMPT_HEADER, QueuePort
from platform_tasks.retry import RetryPolicy

logger = logging.getLogger(__name__)

T = TypeVar("T")

INFRA_ERRORS: tuple[type[BaseException], ...] = (  # "wait and start over", not "failed"
    DatabaseUnavailable,
    psycopg2.OperationalError,
    psycopg2.InterfaceError,
    redis.ConnectionError,
    redis.TimeoutError,
)


class DeadLettered(PlatformError):
    """The job was written to core.dead_letters; raised so Celery records a failure.

    ``dead_letter_id`` is the row's id (``None`` when another delivery had written it).
    """

    def __init__(self, message: str, dead_letter_id: int | None = None) -> None:
        self.dead_letter_id = dead_letter_id
        super().__init__(message)


class _Unavailable(Exception):
    """PostgreSQL or Redis did not answer; the delivery must wait and start over."""


@dataclass(frozen=True)
class Delivery:
    """What the message says about itself, apart from the payload."""

    consumer: str
    queue: str | None
    header_attempt: Any
    priority: int | None
    payload: Any = None
    """The envelope exactly as received: what a dead letter keeps for replay."""
    redelivered: bool = False
    """The broker put this message back after an earlier delivery (its worker died)."""

    @classmethod
    def from_request(cls, task: Any, request: Any) -> Delivery:
        info = getattr(request, "delivery_info", None) or {}
        headers = getattr(request, "headers", None) or {}
        attempt = getattr(request, ATTEMPT_HEADER, None)
        if attempt is None and isinstance(headers, Mapping):
            attempt = headers.get(ATTEMPT_HEADER)
        queue = info.get("routing_key") or getattr(task, "queue", None)
        priority = info.get("priority")
        redelivered = bool(info.get("redelivered")) or bool(
            getattr(request, "redelivered", None)
            or (isinstance(headers, Mapping) and headers.get("redelivered"))
        )
        return cls(
            consumer=task.name,
            queue=queue,
            header_attempt=attempt,
            priority=priority if isinstance(priority, int) else None,
            redelivered=redelivered,
        )


@dataclass(frozen=True)
class _Failure:
    exc: Exception
    attempt: int
    delay: timedelta


class JobRunner:
    """Runs deliveries for one app in one process; holds that process's collaborators."""

    def __init__(
        self,
        app: Any,
        database: Database,
        deliveries: DeliveryCounter,
        *,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.app = app
        self.settings = app.platform_settings
        self.database = database
        self.deliveries = deliveries
        self.clock = clock or (lambda: datetime.now(UTC))
        self._port: QueuePort | None = None

    @classmethod
    def for_app(cls, app: Any, database_url: str) -> JobRunner:
        settings = app.platform_settings
        client = redis.Redis.from_url(
            settings.redis_url, socket_timeout=10, socket_connect_timeout=5
        )
        return cls(
            app,
            Database(database_url, autocommit=True),
            DeliveryCounter(client, delivery_keys(settings.profile)),
        )

    def port(self) -> QueuePort:
        if self._port is None:
            self._port = QueuePort(self.app)
        return self._port

    # -- entry point ---------------------------------------------------------------------

    def run(self, task: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], request: Any
            ) -> Any:  # fmt: skip
        delivery = Delivery.from_request(task, request)
        payload = args[0] if len(args) == 1 and not kwargs else None
        try:
            if payload is None:
                raise EnvelopeError(
                    [("<arguments>", "a PlatformTask takes exactly one positional argument, "
                      f"the envelope; got {len(args)} positional and {len(kwargs)} keyword")]
                )  # fmt: skip
            envelope = parse_envelope(
                payload, task.data_model, max_bytes=self.settings.max_payload_bytes
            )
        except EnvelopeError as exc:
            self._poison(task, delivery, args, kwargs, exc)
            raise
        delivery = replace(delivery, payload=_json_safe(payload))
        token = current_correlation_id.set(envelope.correlation_id)
        try:
            failure = self._until_available(lambda: self._attempt(task, envelope, delivery))
        finally:
            current_correlation_id.reset(token)
        if isinstance(failure, _Failure):
            self._after_failure(task, envelope, delivery, failure)
        return failure

    # -- one attempt --------------------------------------------------------------------

    def _attempt(self, task: Any, envelope: Envelope[Any], delivery: Delivery) -> Any:
        policy = self._policy(delivery)
        job = str(envelope.job_id)
        counted = False
        conn = None
        try:
            conn = self.database.connection()
            cur = conn.cursor()
            if not idempotency.claim(cur, envelope.job_id, delivery.consumer,
                                     begin_transaction=True):  # fmt: skip
                rollback(cur)
                self._log(logging.INFO, "duplicate delivery skipped", "consumer.duplicate_skipped",
                          envelope, delivery)  # fmt: skip
                metrics.duplicate_skipped(delivery.queue, delivery.consumer)
                return None
            state = self.deliveries.observe(delivery.consumer, job,
                                            redelivered=delivery.redelivered,
                                            ttl_seconds=self._ttl(policy))  # fmt: skip
            counted = delivery.redelivered
            attempt = attempt_number(delivery.header_attempt, state.spent)
            if state.exhausted or attempt > policy.max_attempts:
                restarted = self._over_budget(cur, envelope, delivery, policy, state, attempt)
                if restarted is None:
                    return None
                attempt = restarted
            try:
                result = task.execute(envelope, cur)
            except Throttled as exc:
                rollback(cur)
                if counted:
                    self._undo_count(delivery, job)
                return _Failure(exc, attempt - 1, exc.retry_at - self.clock())
            except Exception as exc:
                if is_unavailable(exc, conn):
                    raise
                # counted while the claim still holds a duplicate copy back, so the copy
                # sees this attempt spent
                self.deliveries.failed(delivery.consumer, job, ttl_seconds=self._ttl(policy))
                rollback(cur)
                return self._failed(task, envelope, delivery, policy, attempt, exc)
            commit(cur)
        except INFRA_ERRORS as exc:
            self.database.discard()
            if counted:
                self._undo_count(delivery, job)
            raise _Unavailable(str(exc).strip() or type(exc).__name__) from exc
        self._applied(envelope, delivery, attempt, state)
        return result

    def _failed(self, task: Any, envelope: Envelope[Any], delivery: Delivery,
                policy: RetryPolicy, attempt: int, exc: Exception) -> Any:  # fmt: skip
        """After the rollback: hand back for a retry, or dead-letter while holding the claim."""
        decision = decide(policy, attempt, exc, self._permanent_errors(task))
        if decision.retry:
            assert decision.delay is not None
            return _Failure(exc, attempt, decision.delay)
        record = self._record_for(envelope, delivery, attempt, decision.reason, exc)
        self._exhaust(delivery, envelope, policy)
        try:
            dead_letter_id = self._write_claimed(record, envelope, delivery)
        except INFRA_ERRORS:
            # The handler must not run again: write the row on its own once PostgreSQL is back.
            self.database.discard()
            dead_letter_id = self.write_dead_letter(record, exc)
        else:
            if dead_letter_id is None:
                self._log(logging.INFO, "job applied by another delivery; no dead letter",
                          "consumer.duplicate_skipped", envelope, delivery,
                          attempt=attempt)  # fmt: skip
                metrics.duplicate_skipped(delivery.queue, delivery.consumer)
                return None
            self._dead_lettered(record, dead_letter_id, exc)
        raise DeadLettered(
            f"{record.reason} after {attempt} attempt(s): {error_type_name(exc)}",
            dead_letter_id,
        ) from exc

    def _write_claimed(self, record: DeadLetterRecord, envelope: Envelope[Any],
                       delivery: Delivery) -> int | None:  # fmt: skip
        """Claim the job again, write the dead letter, release the claim, commit.

        The claim keeps a concurrent delivery of the job waiting while the row is written.
        ``None`` when another delivery applied the job in the meantime: nothing to write.
        """
        cur = self.database.connection().cursor()
        if not idempotency.claim(cur, envelope.job_id, delivery.consumer,
                                 begin_transaction=True):  # fmt: skip
            rollback(cur)
            return None
        dead_letter_id = record.write(cur)
        idempotency.release(cur, envelope.job_id, delivery.consumer)
        commit(cur)
        return dead_letter_id

    def _after_failure(self, task: Any, envelope: Envelope[Any], delivery: Delivery,
                       failure: _Failure) -> None:  # fmt: skip
        """Reschedule through the durable delay store and tell Celery it is a retry."""
        run_at = self.clock() + failure.delay
        opts: dict[str, Any] = {"attempt": failure.attempt + 1}
        if delivery.priority is not None:
            opts["priority"] = delivery.priority
        self._until_available(
            lambda: self._schedule(delivery.queue or "default", envelope, run_at, opts)
        )
        metrics.retried(delivery.queue, delivery.consumer)
        self._log(logging.WARNING, "attempt failed; retry scheduled", "consumer.retry_scheduled",
                  envelope, delivery, attempt=failure.attempt,
                  delay_seconds=round(failure.delay.total_seconds(), 3),
                  error_type=error_type_name(failure.exc))  # fmt: skip
        raise Retry(exc=failure.exc, when=run_at)

    def _schedule(self, queue: str, envelope: Envelope[Any], run_at: datetime,
                  opts: dict[str, Any]) -> None:  # fmt: skip
        try:
            self.port().schedule(queue, envelope.to_message(), run_at, opts)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise _Unavailable(str(exc)) from exc

    def _over_budget(self, cur: Any, envelope: Envelope[Any], delivery: Delivery,
                     policy: RetryPolicy, state: DeliveryState, attempt: int
                     ) -> int | None:  # fmt: skip
        """A delivery past the budget: a replay restarts it, anything else ends here.

        Returns the attempt to run (a replay) or ``None`` when this delivery is finished.
        """
        job = str(envelope.job_id)
        latest = latest_dead_letter(cur, envelope.job_id, envelope.kind)
        if latest is not None:
            dead_letter_id, status = latest
            if status == "replayed" and state.generation != dead_letter_id:
                self.deliveries.restart(delivery.consumer, job, generation=dead_letter_id,
                                        ttl_seconds=self._ttl(policy))  # fmt: skip
                self._log(logging.INFO, "replay of a dead letter: attempts start over",
                          "consumer.replay_started", envelope, delivery,
                          dead_letter_id=dead_letter_id)  # fmt: skip
                return 1
            if status != "replayed":
                rollback(cur)
                self._log(logging.INFO, "job already dead-lettered; delivery dropped",
                          "consumer.already_dead_lettered", envelope, delivery,
                          dead_letter_id=dead_letter_id)  # fmt: skip
                return None
        attempts = max(0, attempt - 1)
        record = DeadLetterRecord(
            job_id=envelope.job_id,
            queue=delivery.queue,
            kind=envelope.kind,
            tenant_id=envelope.tenant_id,
            correlation_id=envelope.correlation_id,
            payload=delivery.payload or envelope.to_message(),
            attempts=attempts,
            last_error=(
                f"crash loop: delivered {attempt} times, {attempts} of them started the "
                f"handler without finishing (worker killed?); max_attempts is "
                f"{policy.max_attempts}"
            ),
            error_type="CrashLoop",
            reason=CRASH_LOOP,
        )
        self._exhaust(delivery, envelope, policy)
        dead_letter_id = record.write(cur)
        idempotency.release(cur, envelope.job_id, delivery.consumer)
        commit(cur)
        self._dead_lettered(record, dead_letter_id, None)
        raise DeadLettered(f"crash loop after {attempts} attempt(s)", dead_letter_id)

    # -- dead letters -------------------------------------------------------------------

    def _poison(self, task: Any, delivery: Delivery, args: tuple[Any, ...],
                kwargs: Mapping[str, Any], exc: EnvelopeError) -> None:  # fmt: skip
        payload: Any = args[0] if len(args) == 1 and not kwargs else None
        if payload is None:
            payload = {"args": list(args), "kwargs": dict(kwargs)}
        readable = payload if isinstance(payload, Mapping) else {}
        if not isinstance(payload, Mapping):
            payload = raw_payload(json.dumps(payload, default=repr), "application/json", {})
        record = DeadLetterRecord(
            job_id=_uuid_or_none(readable.get("job_id")),
            queue=delivery.queue,
            kind=_str_or_none(readable.get("kind")) or delivery.consumer,
            tenant_id=_str_or_none(readable.get("tenant_id")),
            correlation_id=_str_or_none(readable.get("correlation_id")),
            payload=_json_safe(dict(payload)),
            attempts=1,
            last_error=str(exc),
            error_type=error_type_name(exc),
            reason=POISON,
        )
        self.write_dead_letter(record, exc)
        metrics.poison(delivery.queue, delivery.consumer)

    def write_dead_letter(self, record: DeadLetterRecord, exc: BaseException | None) -> int:
        """Write ``record`` in its own transaction, waiting for PostgreSQL if it is down."""
        dead_letter_id = self._until_available(lambda: self._write_once(record))
        self._dead_lettered(record, dead_letter_id, exc)
        return dead_letter_id

    def _write_once(self, record: DeadLetterRecord) -> int:
        try:
            conn = self.database.connection()
            with conn.cursor() as cur:
                dead_letter_id = record.write(cur)  # one statement: its own transaction
            return dead_letter_id
        except INFRA_ERRORS as exc:
            self.database.discard()
            raise _Unavailable(str(exc).strip()) from exc

    def _dead_lettered(self, record: DeadLetterRecord, dead_letter_id: int,
                       exc: BaseException | None) -> None:  # fmt: skip
        metrics.dead_lettered(record.queue, record.kind, record.reason)
        logger.error(
            "job dead-lettered (%s) as row %s", record.reason, dead_letter_id,
            extra={"event": "consumer.dead_lettered", "job_id": str(record.job_id),
                   "queue": record.queue, "kind": record.kind, "tenant_id": record.tenant_id,
                   "correlation_id": record.correlation_id, "attempts": record.attempts,
                   "reason": record.reason, "dead_letter_id": dead_letter_id},
        )  # fmt: skip
        record.alert(dead_letter_id, exc)

    def _record_for(self, envelope: Envelope[Any], delivery: Delivery, attempt: int,
                    reason: str, exc: BaseException) -> DeadLetterRecord:  # fmt: skip
        return DeadLetterRecord(
            job_id=envelope.job_id,
            queue=delivery.queue,
            kind=envelope.kind,
            tenant_id=envelope.tenant_id,
            correlation_id=envelope.correlation_id,
            payload=delivery.payload or envelope.to_message(),
            attempts=attempt,
            last_error=describe_error(exc),
            error_type=error_type_name(exc),
            reason=reason,
        )

    # -- waiting for the servers ----------------------------------------------------------

    def _until_available(self, step: Callable[[], T]) -> T:
        """Run ``step`` until PostgreSQL and Redis answer; the message stays unacked meanwhile."""
        delay = 0.25
        while True:
            try:
                return step()
            except _Unavailable as exc:
                logger.warning("database or Redis unavailable (%s); waiting", exc,
                               extra={"event": "consumer.waiting_for_servers"})  # fmt: skip
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    # -- small helpers --------------------------------------------------------------------

    def _applied(self, envelope: Envelope[Any], delivery: Delivery, attempt: int,
                 state: DeliveryState) -> None:  # fmt: skip
        metrics.processed(delivery.queue, delivery.consumer)
        if state.tracked:  # most jobs never had a hash: nothing to clear, no round trip
            try:
                self.deliveries.forget(delivery.consumer, str(envelope.job_id))
            except redis.RedisError:
                logger.warning("could not clear the delivery count", exc_info=True,
                               extra={"event": "consumer.count_not_cleared"})  # fmt: skip
        if logger.isEnabledFor(logging.DEBUG):
            self._log(logging.DEBUG, "job applied", "consumer.applied", envelope, delivery,
                      attempt=attempt)  # fmt: skip

    def _undo_count(self, delivery: Delivery, job: str) -> None:
        try:
            self.deliveries.undo(delivery.consumer, job)
        except redis.RedisError:
            logger.warning("could not take back a delivery count", exc_info=True,
                           extra={"event": "consumer.count_not_undone"})  # fmt: skip

    def _policy(self, delivery: Delivery) -> RetryPolicy:
        policy: RetryPolicy = self.app.retry_policy_for(delivery.queue)
        return policy

    def _ttl(self, policy: RetryPolicy) -> int:
        return delivery_ttl_seconds(policy, self.settings.visibility_timeout_seconds)

    def _permanent_errors(self, task: Any) -> tuple[type[BaseException], ...]:
        return tuple(getattr(task, "permanent_errors", ()) or ())

    def _exhaust(self, delivery: Delivery, envelope: Envelope[Any], policy: RetryPolicy) -> None:
        """Spend the rest of the budget so a duplicate still in flight is not run again."""
        try:
            self.deliveries.exhaust(delivery.consumer, str(envelope.job_id),
                                    ttl_seconds=self._ttl(policy))  # fmt: skip
        except redis.RedisError:
            logger.warning("could not mark the delivery budget spent", exc_info=True,
                           extra={"event": "consumer.budget_not_marked"})  # fmt: skip

    def _log(self, level: int, message: str, event: str, envelope: Envelope[Any],
             delivery: Delivery, **fields: Any) -> None:  # fmt: skip
        logger.log(level, "%s: %s", message, envelope.redacted(),
                   extra={"event": event, "job_id": str(envelope.job_id), "queue": delivery.queue,
                          "kind": envelope.kind, "tenant_id": envelope.tenant_id,
                          "correlation_id": envelope.correlation_id, **fields})  # fmt: skip


def _uuid_or_none(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value is not None else None
    except (TypeError, ValueError):
        return None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


_runners: dict[tuple[int, int], JobRunner] = {}


def runner_for(app: Any) -> JobRunner:
    """This process's runner for ``app`` (created on first use, again after a fork).

    Raises :class:`~platform_tasks.errors.ConfigurationError` naming
    ``PLATFORM_DATABASE_URL`` when it is not set.
    """
    key = (id(app), os.getpid())
    runner = _runners.get(key)
    if runner is None:
        runner = JobRunner.for_app(app, require_database_url(app.platform_settings))
        configure_alerts(app.platform_settings.sentry_dsn)
        _runners[key] = runner
    return runner
