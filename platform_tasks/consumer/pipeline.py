"""One delivery of a :class:`~platform_tasks.consumer.task.PlatformTask`: decide, then settle.

:meth:`DeliveryPipeline.decide` turns a delivery into exactly one
:mod:`verdict <platform_tasks.consumer.verdicts>`, and :meth:`DeliveryPipeline.settle`
acts on it. Deciding, in order:

1. validate the envelope; invalid → a poison :class:`GaveUp`, the handler never runs;
2. open a transaction and claim ``(job_id, consumer)`` in ``core.processed_jobs`` (the
   ``BEGIN`` travels with the claim: one round trip); no row inserted → :class:`Duplicate`
   (or wait for a concurrent delivery of the same job to finish);
3. ask Redis about the job before the handler runs: a redelivery (its worker died) is
   counted there, so crash loops end; a first delivery only reads the attempts already
   spent and whether the job was dead-lettered meanwhile, and (when the platform's Redis
   is the broker) only when the claim saw a :mod:`delivery mark
   <platform_tasks.consumer.marks>` (every write of the job's Redis state is preceded by
   one): a job without one has nothing in Redis to read. Past
   ``max_attempts`` the job is a crash-loop :class:`GaveUp`, not run;
4. run ``task.execute(envelope, tx)`` in that transaction (its publishes join it: see
   :mod:`~platform_tasks.publishing.outbox`); a handler that broke the
   transaction (closed it, ended it, or caught a SQL error so that ``COMMIT`` answers
   ``ROLLBACK``) failed its attempt like one that raised;
5. commit → :class:`Applied`; a failure is counted in Redis while the claim still holds a
   duplicate copy back, then :func:`~platform_tasks.consumer.retry.decide` gives
   :class:`RetryAt` or :class:`GaveUp`, whose row is written (on the marks'
   connection) before the rollback releases the claim, so a copy waiting on the claim
   finds the job dead-lettered instead of running it again;
   :class:`~platform_tasks.errors.Throttled` gives :class:`ThrottledUntil` (the same
   attempt again, nothing spent).

Whatever is raised, the transaction ends in a commit or a rollback before the verdict
leaves step 2 (a ``finally``; a connection in an unknown state is discarded). When
PostgreSQL or Redis cannot do its part the verdict is :class:`Wait`: the message stays
unacked and the delivery starts over once they answer. Settling stores retries, writes
dead letters, and calls the hooks (logs, alerts, metrics); a step that must happen before
the ack is retried until it succeeds, so nothing is acked that is not applied,
rescheduled or dead-lettered.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from celery.exceptions import Retry

from platform_tasks.brokers.redis_client import REDIS_ERRORS, build_redis
from platform_tasks.consumer import idempotency
from platform_tasks.consumer.attempts import (
    UNTRACKED,
    DeliveryCounter,
    DeliveryState,
    attempt_number,
    delivery_ttl_seconds,
)
from platform_tasks.consumer.cancels import CancelCheck, cancel_delivery, running_job
from platform_tasks.consumer.delivery import Delivery
from platform_tasks.consumer.hooks import Hooks, hooks_of
from platform_tasks.consumer.marks import DeliveryMarks, reads_can_skip
from platform_tasks.consumer.retry import CRASH_LOOP, POISON, RetryPolicy, decide
from platform_tasks.consumer.servers import INFRASTRUCTURE_ERRORS, Backoff, describe, until_done
from platform_tasks.consumer.transaction import JobTransaction
from platform_tasks.consumer.verdicts import (
    Applied,
    Duplicate,
    GaveUp,
    RetryAt,
    ThrottledUntil,
    Verdict,
    Wait,
)
from platform_tasks.dead_letters.dead_letter import DeadLetter
from platform_tasks.dead_letters.records import (
    describe_error,
    error_type_name,
    latest_dead_letter,
    pending_dead_letter,
    raw_payload,
)
from platform_tasks.envelope import Envelope, parse_envelope
from platform_tasks.errors import (
    DeadLettered,
    EnvelopeError,
    HardTimeLimitExceeded,
    ServersUnavailable,
    Throttled,
)
from platform_tasks.keys import delivery_keys
from platform_tasks.limits.admission import NOTHING_HELD, admit, release_unique
from platform_tasks.limits.unique import UNIQUE_HEADER
from platform_tasks.observability.alerts import configure_alerts
from platform_tasks.observability.context import current_correlation_id
from platform_tasks.observability.trace_context import current_trace_headers, trace_of
from platform_tasks.postgres.database import Database, require_database_url
from platform_tasks.publishing.outbox import handler_publishes
from platform_tasks.publishing.queue_port import QueuePort

if TYPE_CHECKING:
    from platform_tasks.app import PlatformCelery

logger = logging.getLogger(__name__)


class DeliveryPipeline:
    """Decides and settles deliveries for one app in one process (its collaborators)."""

    def __init__(
        self,
        app: PlatformCelery,
        database: Database,
        deliveries: DeliveryCounter,
        *,
        hooks: Hooks | None = None,
        clock: Callable[[], datetime] | None = None,
        sleep: Callable[[float], None] | None = None,
        port: QueuePort | None = None,
        marks: DeliveryMarks | None = None,
        skip_unmarked_reads: bool | None = None,
    ) -> None:
        self.app = app
        self.settings = app.platform_settings
        self.database = database
        self.deliveries = deliveries
        self.hooks = hooks if hooks is not None else Hooks(hooks_of(app))
        self.clock = clock or (lambda: datetime.now(UTC))
        self._sleep = sleep
        self._port = port
        self.marks = marks if marks is not None else DeliveryMarks.beside(database)
        self.skip_unmarked_reads = (
            reads_can_skip(self.settings) if skip_unmarked_reads is None else skip_unmarked_reads
        )
        self.cancels = CancelCheck()

    @classmethod
    def for_app(cls, app: PlatformCelery, database_url: str) -> DeliveryPipeline:
        settings = app.platform_settings
        return cls(
            app,
            Database(database_url, autocommit=True),
            DeliveryCounter(
                None,
                delivery_keys(settings.profile),
                connect=lambda: build_redis(settings, timeout=10, connect_timeout=5),
            ),
        )

    def close(self) -> None:
        """Close the connections this thread opened: PostgreSQL (the job's and the marks'),
        the platform's Redis, the queue port's."""
        self.database.close()
        self.marks.database.close()
        self.deliveries.close()
        if self._port is not None:
            self._port.close()
            self._port = None

    def port(self) -> QueuePort:
        if self._port is None:
            self._port = QueuePort(self.app)
        return self._port

    def _backoff(self) -> Backoff:
        return Backoff(self._sleep) if self._sleep is not None else Backoff()

    # -- entry point ---------------------------------------------------------------------

    def process(
        self, task: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], request: Any
    ) -> Any:
        """Decide and settle one delivery; what Celery gets back (or the raise it sees)."""
        payload = args[0] if len(args) == 1 and not kwargs else None
        delivery = Delivery.from_request(task, request, _snapshot(payload))
        try:
            if payload is None:
                raise EnvelopeError(
                    [
                        (
                            "<arguments>",
                            "a PlatformTask takes exactly one positional argument, "
                            f"the envelope; got {len(args)} positional and {len(kwargs)} keyword",
                        )
                    ]
                )
            envelope = parse_envelope(
                payload, task.data_model, max_bytes=self.settings.max_payload_bytes
            )
        except EnvelopeError as exc:
            return self.settle(task, delivery, None, self._poison(delivery, args, kwargs, exc))
        token = current_correlation_id.set(envelope.correlation_id)
        trace_token = current_trace_headers.set(trace_of(delivery.headers))
        self.hooks.emit("on_started", delivery, envelope)
        try:
            backoff: Backoff | None = None
            while True:
                verdict = self.decide(task, envelope, delivery)
                if not isinstance(verdict, Wait):
                    break
                self.hooks.emit("on_waiting", delivery, verdict.cause)
                if backoff is None:
                    backoff = self._backoff()
                backoff.wait(verdict.cause, outage=verdict.outage)
            return self.settle(task, delivery, envelope, verdict)
        finally:
            current_correlation_id.reset(token)
            current_trace_headers.reset(trace_token)

    # -- deciding ---------------------------------------------------------------------

    def decide(self, task: Any, envelope: Envelope[Any], delivery: Delivery) -> Verdict:
        """One try at the delivery; the job's transaction has ended when this returns."""
        policy = self._policy(delivery)
        job = str(envelope.job_id)
        counted = False
        tx: JobTransaction | None = None
        held = NOTHING_HELD
        try:
            tx = JobTransaction(self.database)
            claimed, marked = tx.claim_and_look(job, delivery.consumer)
            if not claimed:
                return Duplicate("applied")
            cancelled = cancel_delivery(self.cancels, tx, envelope, delivery)
            if cancelled is not None:  # an operator cancelled it (platform-tasks jobs cancel)
                return cancelled
            if delivery.redelivered or marked or not self.skip_unmarked_reads:
                if delivery.redelivered:  # the count below writes the job's Redis state
                    self.marks.mark(delivery.consumer, job)
                state = self.deliveries.observe(
                    delivery.consumer,
                    job,
                    redelivered=delivery.redelivered,
                    ttl_seconds=self._ttl(policy),
                )
            else:  # no mark: nothing of this job's is in Redis
                state = UNTRACKED
            counted = delivery.redelivered
            attempt = attempt_number(delivery.header_attempt, state.spent)
            if state.time_limit is not None and delivery.redelivered and not state.exhausted:
                # the pool killed the previous delivery at its hard time limit (the main
                # process recorded it): that attempt failed; settle it, do not run again
                stopped = attempt_number(delivery.header_attempt, state.spent - 1)
                self.deliveries.settle_time_limit(
                    delivery.consumer, job, ttl_seconds=self._ttl(policy)
                )
                counted = False
                return self._decided(
                    task,
                    tx,
                    envelope,
                    delivery,
                    policy,
                    stopped,
                    HardTimeLimitExceeded(state.time_limit, stopped),
                )
            if state.exhausted or attempt > policy.max_attempts:
                over = self._over_budget(tx, envelope, delivery, policy, state, attempt)
                if not isinstance(over, int):
                    return over
                attempt = over
            error: Exception | None = None
            try:
                held = admit(task, envelope, delivery.unique_key)  # its limits, or wait
                with (
                    running_job(self.cancels, tx.cursor, envelope, delivery),
                    handler_publishes(tx.cursor, envelope.job_id, delivery.consumer),
                ):
                    result = task.execute(envelope, tx.cursor)
            except Throttled as exc:
                tx.rollback()
                if counted:
                    self._undo_count(delivery, job)
                return ThrottledUntil(exc.retry_at, attempt, exc.reason)
            except Exception as exc:
                # the platform's own server calls inside the run (the rate limits of a
                # NotificationTask) and a lost PostgreSQL connection wait; the rest failed
                if isinstance(exc, ServersUnavailable) or tx.server_gone(exc):
                    raise
                error = exc
            if error is None:
                error = tx.broken()
            if error is None:
                error = tx.commit()
                if error is None:
                    return Applied(attempt, result, tracked=state.tracked)
            return self._failed(task, tx, envelope, delivery, policy, attempt, error)
        except Exception as exc:
            # the platform's own steps (not the handler: its errors are caught above).
            # An outage waits; anything else waits too, loudly, rather than ack the job
            if not isinstance(exc, INFRASTRUCTURE_ERRORS):
                logger.error(
                    "a consumer step failed (%s); the delivery waits",
                    describe(exc),
                    exc_info=True,
                    extra={"event": "consumer.step_failed", "job_id": job},
                )
            self.database.discard()
            if counted:
                self._undo_count(delivery, job)
            return Wait(describe(exc), outage=isinstance(exc, INFRASTRUCTURE_ERRORS))
        finally:
            if tx is not None:
                tx.end()
            held.release()  # after the commit: a slot frees once the job's work is visible

    def _failed(
        self,
        task: Any,
        tx: JobTransaction,
        envelope: Envelope[Any],
        delivery: Delivery,
        policy: RetryPolicy,
        attempt: int,
        exc: Exception,
    ) -> Verdict:
        """A failed attempt: count it (while the claim holds copies back), roll back, decide."""
        # a Redis (or mark) refusal here raises out to the caller's Wait, before the rollback
        self.marks.mark(delivery.consumer, str(envelope.job_id))
        self.deliveries.failed(
            delivery.consumer, str(envelope.job_id), ttl_seconds=self._ttl(policy)
        )
        return self._decided(task, tx, envelope, delivery, policy, attempt, exc)

    def _decided(
        self,
        task: Any,
        tx: JobTransaction,
        envelope: Envelope[Any],
        delivery: Delivery,
        policy: RetryPolicy,
        attempt: int,
        exc: Exception,
    ) -> Verdict:
        """Attempt ``attempt`` failed with ``exc`` and is counted: retry it or dead-letter."""
        decision = decide(policy, attempt, exc, tuple(task.permanent_errors or ()))
        if decision.retry:
            tx.rollback()
            assert decision.delay is not None
            return RetryAt(self.clock() + decision.delay, attempt, exc)
        record = self._record(
            envelope,
            delivery,
            attempts=attempt,
            reason=decision.reason,
            last_error=describe_error(exc),
            error_type=error_type_name(exc),
        )
        # Written while this transaction still holds the claim, so a copy of the job that
        # waits on it finds the budget spent and the dead letter committed once it gets
        # the claim: it is a duplicate, never a second run and a second row. The handler's
        # work is rolled back after; the row goes through the marks' own connection.
        self._exhaust(delivery, envelope)
        written = until_done(
            lambda: self._write_beside(record), "write the dead letter", self._sleep_fn()
        )
        tx.rollback()
        dead_letter_id, new = written
        if not new:
            return Duplicate("dead_lettered", dead_letter_id)
        return GaveUp(record, exc, claim=False, row=dead_letter_id)

    def _over_budget(
        self,
        tx: JobTransaction,
        envelope: Envelope[Any],
        delivery: Delivery,
        policy: RetryPolicy,
        state: DeliveryState,
        attempt: int,
    ) -> int | Verdict:
        """A delivery past the budget: a replay starts over (its attempt), else a verdict."""
        job = str(envelope.job_id)
        latest = latest_dead_letter(tx.cursor, envelope.job_id, envelope.kind)
        if latest is not None:
            dead_letter_id, status = latest
            if status == "replayed" and state.generation != dead_letter_id:
                self.marks.mark(delivery.consumer, job)
                self.deliveries.restart(
                    delivery.consumer, job, generation=dead_letter_id, ttl_seconds=self._ttl(policy)
                )
                _log_replay(envelope, delivery, dead_letter_id)
                return 1
            if status != "replayed":
                return Duplicate("dead_lettered", dead_letter_id)
        attempts = max(0, attempt - 1)
        record = self._record(
            envelope,
            delivery,
            attempts=attempts,
            reason=CRASH_LOOP,
            error_type="CrashLoop",
            last_error=(
                f"crash loop: delivered {attempt} times, {attempts} of them started the "
                f"handler without finishing (worker killed?); max_attempts is "
                f"{policy.max_attempts}"
            ),
        )
        return GaveUp(record, None)

    def _poison(
        self,
        delivery: Delivery,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        exc: EnvelopeError,
    ) -> GaveUp:
        payload: Any = args[0] if len(args) == 1 and not kwargs else None
        if payload is None:
            payload = {"args": list(args), "kwargs": dict(kwargs)}
        readable = payload if isinstance(payload, Mapping) else {}
        if not isinstance(payload, Mapping):
            payload = raw_payload(json.dumps(payload, default=repr), "application/json", {})
        record = DeadLetter(
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
            headers=dict(delivery.headers) if delivery.headers else None,
        )
        return GaveUp(record, exc, claim=False)

    # -- settling ---------------------------------------------------------------------

    def settle(
        self, task: Any, delivery: Delivery, envelope: Envelope[Any] | None, verdict: Verdict
    ) -> Any:
        """Act on the verdict: what Celery sees is the return value or the raise."""
        if isinstance(verdict, Applied):
            assert envelope is not None
            if verdict.tracked:  # most jobs never had a hash: nothing to clear
                self._forget(delivery, envelope)
            self.hooks.emit("on_applied", delivery, envelope, verdict)
            return verdict.result
        if isinstance(verdict, Duplicate):
            assert envelope is not None
            if delivery.unique_key is not None and verdict.reason != "applied":
                release_unique(self.app, delivery.unique_key, str(envelope.job_id))
            self.hooks.emit("on_duplicate", delivery, envelope, verdict)
            return None
        if isinstance(verdict, RetryAt | ThrottledUntil):
            assert envelope is not None
            attempt = verdict.attempt + 1 if isinstance(verdict, RetryAt) else verdict.attempt
            self._store_retry(delivery, envelope, verdict.at, attempt)
            if isinstance(verdict, RetryAt):
                self.hooks.emit("on_retry_scheduled", delivery, envelope, verdict)
                what = f"attempt {verdict.attempt} failed ({error_type_name(verdict.error)})"
            else:
                self.hooks.emit("on_throttled", delivery, envelope, verdict)
                what = f"throttled ({verdict.reason})"
            raise Retry(f"{what}; attempt {attempt} at {verdict.at.isoformat()}", when=verdict.at)
        if isinstance(verdict, GaveUp):
            if delivery.unique_key is not None and verdict.record.job_id is not None:
                # a job dead-lettered before it started still held its key
                release_unique(self.app, delivery.unique_key, str(verdict.record.job_id))
            return self._settle_dead_letter(delivery, envelope, verdict)
        raise AssertionError(f"unsettled verdict {verdict!r}")  # Wait never reaches here

    def _settle_dead_letter(
        self, delivery: Delivery, envelope: Envelope[Any] | None, verdict: GaveUp
    ) -> Any:
        record = verdict.record
        if verdict.row is not None:  # written while the delivery still held the claim
            dead_letter_id = verdict.row
        elif verdict.claim and envelope is not None:
            self._exhaust(delivery, envelope)
            written = until_done(
                lambda: self._write_claimed(record, envelope, delivery),
                "write the dead letter",
                self._sleep_fn(),
            )
            if written is None or isinstance(written, Duplicate):
                duplicate = written or Duplicate("applied_by_other")
                self.hooks.emit("on_duplicate", delivery, envelope, duplicate)
                return None
            dead_letter_id = written
        else:
            if envelope is not None:
                self._exhaust(delivery, envelope)
            dead_letter_id = until_done(
                lambda: self._write_alone(record), "write the dead letter", self._sleep_fn()
            )
        self.hooks.emit("on_dead_lettered", record, dead_letter_id, verdict.error)
        raise DeadLettered(
            f"dead-lettered as row {dead_letter_id} ({record.reason} after {record.attempts} "
            f"attempt(s)): {record.error_type or 'error'}",
            dead_letter_id,
        ) from None

    def _write_claimed(
        self, record: DeadLetter, envelope: Envelope[Any], delivery: Delivery
    ) -> int | Duplicate | None:
        """Claim the job again, write the dead letter, release the claim, commit.

        ``None`` when another delivery applied the job in the meantime, a
        :class:`Duplicate` when one dead-lettered it: nothing to write.
        """
        tx = JobTransaction(self.database)
        try:
            if not tx.claim(envelope.job_id, delivery.consumer):
                return None
            pending = pending_dead_letter(tx.cursor, envelope.job_id, envelope.kind)
            if pending is not None:
                return Duplicate("dead_lettered", pending)
            dead_letter_id = record.write(tx.cursor)
            idempotency.release(tx.cursor, envelope.job_id, delivery.consumer)
            problem = tx.commit()
            if problem is not None:
                raise problem
            return dead_letter_id
        finally:
            tx.end()

    def _write_beside(self, record: DeadLetter) -> tuple[int, bool]:
        """Write the row on the marks' connection, unless the job's generation has one.

        ``(id, True)`` for the row written here; ``(id, False)`` for a row of this job
        that is not replayed (written by a copy that ran while PostgreSQL restarted, or
        before a Redis restart lost the spent budget): the job is dead-lettered once.
        """
        assert record.job_id is not None
        tx = JobTransaction(self.marks.database)
        try:
            tx.begin()
            pending = pending_dead_letter(tx.cursor, record.job_id, record.kind)
            if pending is not None:
                return pending, False
            dead_letter_id = record.write(tx.cursor)
            problem = tx.commit()
            if problem is not None:
                raise problem
            return dead_letter_id, True
        finally:
            tx.end()

    def _write_alone(self, record: DeadLetter) -> int:
        tx = JobTransaction(self.database)
        try:
            tx.begin()
            dead_letter_id = record.write(tx.cursor)
            problem = tx.commit()
            if problem is not None:
                raise problem
            return dead_letter_id
        finally:
            tx.end()

    def _store_retry(
        self, delivery: Delivery, envelope: Envelope[Any], run_at: datetime, attempt: int
    ) -> None:
        opts: dict[str, Any] = {"attempt": attempt}
        if delivery.headers:  # trace context and custom headers survive the retry
            opts["headers"] = dict(delivery.headers)
        if delivery.priority is not None:
            opts["priority"] = delivery.priority
        if delivery.unique_key is not None:  # a job put back to wait still holds its key
            opts["headers"] = {**opts.get("headers", {}), UNIQUE_HEADER: delivery.unique_key}
        queue = delivery.queue or self.app.conf.task_default_queue or "default"
        until_done(
            lambda: self.port().schedule(queue, envelope.to_message(), run_at, opts),
            "store the retry",
            self._sleep_fn(),
        )

    def _sleep_fn(self) -> Callable[[float], None]:
        return self._sleep or time.sleep

    # -- small helpers --------------------------------------------------------------------

    def _record(
        self,
        envelope: Envelope[Any],
        delivery: Delivery,
        *,
        attempts: int,
        reason: str,
        last_error: str,
        error_type: str,
    ) -> DeadLetter:
        return DeadLetter(
            job_id=envelope.job_id,
            queue=delivery.queue,
            kind=envelope.kind,
            tenant_id=envelope.tenant_id,
            correlation_id=envelope.correlation_id,
            payload=(
                _json_safe(delivery.payload)
                if delivery.payload is not None
                else envelope.to_message()
            ),
            attempts=attempts,
            last_error=last_error,
            error_type=error_type,
            reason=reason,
            headers=dict(delivery.headers) if delivery.headers else None,
        )

    def _forget(self, delivery: Delivery, envelope: Envelope[Any]) -> None:
        try:
            self.deliveries.forget(delivery.consumer, str(envelope.job_id))
        except REDIS_ERRORS:
            _warn("could not clear the delivery count", "consumer.count_not_cleared")

    def _undo_count(self, delivery: Delivery, job: str) -> None:
        try:
            self.deliveries.undo(delivery.consumer, job)
        except REDIS_ERRORS:
            _warn("could not take back a delivery count", "consumer.count_not_undone")

    def _exhaust(self, delivery: Delivery, envelope: Envelope[Any]) -> None:
        """Spend the rest of the budget so a duplicate still in flight is not run again."""
        try:
            self.marks.mark(delivery.consumer, str(envelope.job_id))
        except Exception:  # best effort: the dead letter row about to be written is a mark too
            _warn("could not mark the job's delivery state", "consumer.mark_not_written")
        try:
            self.deliveries.exhaust(
                delivery.consumer,
                str(envelope.job_id),
                ttl_seconds=self._ttl(self._policy(delivery)),
            )
        except REDIS_ERRORS:
            _warn("could not mark the delivery budget spent", "consumer.budget_not_marked")

    def _policy(self, delivery: Delivery) -> RetryPolicy:
        policy: RetryPolicy = self.app.retry_policy_for(delivery.queue)
        return policy

    def _ttl(self, policy: RetryPolicy) -> int:
        return delivery_ttl_seconds(policy, self.settings.visibility_timeout_seconds)


def _warn(message: str, event: str) -> None:
    logger.warning(message, exc_info=True, extra={"event": event})


def _log_replay(envelope: Envelope[Any], delivery: Delivery, dead_letter_id: int) -> None:
    logger.info(
        "replay of a dead letter: attempts start over: %s",
        envelope.redacted(),
        extra={
            "event": "consumer.replay_started",
            "job_id": str(envelope.job_id),
            "queue": delivery.queue,
            "kind": envelope.kind,
            "dead_letter_id": dead_letter_id,
        },
    )


def _uuid_or_none(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value is not None else None
    except (TypeError, ValueError):
        return None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


def _snapshot(value: Any) -> Any:
    """The payload as received, out of the handler's reach: its dicts and lists copied.

    A handler gets the validated envelope, but with ``data_model=dict`` the values nested
    in ``data`` are the decoded message's own objects, so a handler that changed one in
    place would change what its dead letter keeps for replay. The body came through the
    JSON serializer, so everything else in it is immutable; it is made JSON-safe only when
    a dead letter is written (the JSON round trip it replaces cost about 30 µs of the
    175 µs per job the pipeline's own code took, measured in BENCHMARKS.md).
    """
    if isinstance(value, dict):
        return {
            key: _snapshot(item) if isinstance(item, _CONTAINERS) else item
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_snapshot(item) if isinstance(item, _CONTAINERS) else item for item in value]
    return value


_CONTAINERS = (dict, list, tuple)
"""What :func:`_snapshot` copies; every other value of a decoded body is immutable, and is
kept as it is without a call per value."""


_pipelines: dict[tuple[int, int], DeliveryPipeline] = {}


def pipeline_for(app: PlatformCelery) -> DeliveryPipeline:
    """This process's pipeline for ``app`` (created on first use, again after a fork).

    Raises :class:`~platform_tasks.errors.ConfigurationError` naming
    ``PLATFORM_DATABASE_URL`` when it is not set.
    """
    key = (id(app), os.getpid())
    pipeline = _pipelines.get(key)
    if pipeline is None or pipeline.app is not app:  # an id can be reused by a later app
        pipeline = DeliveryPipeline.for_app(app, require_database_url(app.platform_settings))
        configure_alerts(app.platform_settings.sentry_dsn)
        _pipelines[key] = pipeline
    return pipeline


def close_pipeline(app: PlatformCelery) -> None:
    """Close this process's pipeline for ``app``, if it has one.

    Called by ``app.close()``. A worker's app lives as long as its process, but an app made
    at run time (a test's) would otherwise keep its consumer's PostgreSQL sessions open
    until the process exits. A later job of the same app opens a new pipeline.
    """
    pipeline = _pipelines.pop((id(app), os.getpid()), None)
    if pipeline is not None:
        pipeline.close()
