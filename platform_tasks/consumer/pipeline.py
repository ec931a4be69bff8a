"""One delivery of a :class:`~platform_tasks.consumer.task.PlatformTask`: decide, then settle.

:meth:`DeliveryPipeline.decide` turns a delivery into exactly one
:mod:`verdict <platform_tasks.consumer.verdicts>`, and :meth:`DeliveryPipeline.settle`
acts on it. Deciding, in order:

1. validate the envelope; invalid → a poison :class:`GaveUp`, the handler never runs;
2. open a transaction and claim ``(job_id, consumer)`` in ``core.processed_jobs`` (the
   ``BEGIN`` travels with the claim, with a look for the job's :mod:`delivery mark
   <platform_tasks.consumer.marks>`: one round trip); no row inserted → :class:`Duplicate`
   (or wait for a concurrent delivery of the same job to finish);
3. pass the :mod:`gates <platform_tasks.consumer.gates>`, in order: an operator's cancel;
   the job's state in Redis (a redelivery is counted there, so crash loops end; a first
   delivery without a mark has nothing there to read); an attempt stopped at its hard
   time limit; the attempt budget (a replay starts over; past ``max_attempts`` a
   crash-loop :class:`GaveUp`). A gate's verdict ends the delivery without running it;
4. run ``task.execute(envelope, tx)`` in that transaction (its publishes join it: see
   :mod:`~platform_tasks.publishing.outbox`), within the job's limits
   (:func:`~platform_tasks.limits.admission.admit`); a handler that broke the
   transaction (closed it, ended it, or caught a SQL error so that ``COMMIT`` answers
   ``ROLLBACK``) failed its attempt like one that raised;
5. commit → :class:`Applied`; a failure is counted in Redis while the claim still holds a
   duplicate copy back, then :func:`~platform_tasks.consumer.retry.decide` gives
   :class:`RetryAt` or :class:`GaveUp`, whose row is written (on the marks'
   connection, :mod:`~platform_tasks.consumer.dead_letter_writer`) before the rollback
   releases the claim, so a copy waiting on the claim finds the job dead-lettered
   instead of running it again; :class:`~platform_tasks.errors.Throttled` gives
   :class:`ThrottledUntil` (the same attempt again, nothing spent).

Whatever is raised, the transaction ends in a commit or a rollback before the verdict
leaves step 2 (a ``finally``; a connection in an unknown state is discarded). When
PostgreSQL or Redis cannot do its part the verdict is :class:`Wait`: the message stays
unacked and the delivery starts over once they answer. Settling stores retries, writes
dead letters, and calls the hooks (logs, alerts, metrics); a step that must happen before
the ack is retried until it succeeds, so nothing is acked that is not applied,
rescheduled or dead-lettered. Every write of the job's Redis state goes through
:class:`~platform_tasks.consumer.job_state.JobState`, which writes its mark first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from celery.exceptions import Retry

from platform_tasks.app_state import ProcessState
from platform_tasks.batches.endings import (
    batch_child,
    count_applied,
    count_applied_with_commit,
)
from platform_tasks.brokers.redis_client import build_redis
from platform_tasks.consumer.attempts import DeliveryCounter, delivery_ttl_seconds
from platform_tasks.consumer.cancels import CancelCheck, running_job
from platform_tasks.consumer.dead_letter_writer import (
    DeadLetterWriter,
    Mode,
    Written,
    job_record,
    poison_record,
)
from platform_tasks.consumer.delivery import Delivery
from platform_tasks.consumer.gates import BEFORE_RUN, Gate, Run
from platform_tasks.consumer.hooks import Hooks, hooks_of
from platform_tasks.consumer.job_state import JobState
from platform_tasks.consumer.marks import DeliveryMarks, reads_can_skip
from platform_tasks.consumer.retry import RetryPolicy, decide
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
from platform_tasks.dead_letters.records import describe_error, error_type_name
from platform_tasks.envelope import Envelope, parse_envelope
from platform_tasks.errors import DeadLettered, EnvelopeError, ServersUnavailable, Throttled
from platform_tasks.headers import DELAY_REASON_HEADER, UNIQUE_HEADER
from platform_tasks.jobs_status.output import record_output
from platform_tasks.jobs_status.running import JobMarker, RunningMarkers
from platform_tasks.keys import delivery_keys
from platform_tasks.limits.admission import CAP_REASON, admit, release_unique
from platform_tasks.observability.alerts import configure_alerts
from platform_tasks.observability.context import current_correlation_id
from platform_tasks.observability.trace_context import current_trace_headers, trace_of
from platform_tasks.postgres.database import Database, require_database_url
from platform_tasks.publishing.outbox import handler_publishes
from platform_tasks.publishing.queue_port import QueuePort

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

logger = logging.getLogger(__name__)


class DeliveryPipeline:
    """Decides and settles deliveries for one app in one process (its collaborators)."""

    gates: tuple[Gate, ...] = BEFORE_RUN
    """The pre-run checks, in order (:mod:`platform_tasks.consumer.gates`)."""

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
        self.state = JobState(self.marks, deliveries)
        self.writer = DeadLetterWriter(database, self.marks.database, sleep, port=self.port)
        self.skip_unmarked_reads = (
            reads_can_skip(self.settings) if skip_unmarked_reads is None else skip_unmarked_reads
        )
        self.cancels = CancelCheck()
        self.markers = (
            RunningMarkers(
                lambda: build_redis(self.settings, timeout=2, connect_timeout=2),
                self.settings.profile,
            )
            if self.settings.job_status
            else None
        )

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
        if self.markers is not None:
            self.markers.close()
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
        except EnvelopeError as exc:  # step 1: a poison message
            poison = GaveUp(poison_record(delivery, args, kwargs, exc), exc, claim=False)
            return self.settle(task, delivery, None, poison)
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
        """One try (steps 2-5 of the module docstring); its transaction has ended on return."""
        policy = self._policy(delivery)
        run = Run(task, envelope, delivery, policy, self._ttl(policy))
        try:
            run.tx = JobTransaction(self.database)  # 2. claim, and look for a mark
            correlation = envelope.correlation_id if self.markers is not None else None
            claimed, run.marked = run.tx.claim_and_look(run.job, delivery.consumer, correlation)
            if not claimed:
                return Duplicate("applied")
            for gate in self.gates:  # 3. the pre-run checks
                verdict = gate(self, run)
                if verdict is not None:
                    return verdict
            return self._run(run)  # 4. and 5.
        except Exception as exc:
            return self._wait(run, exc)
        finally:
            run.end()

    def _run(self, run: Run) -> Verdict:
        """Run the handler within the job's limits and commit, or settle the failure."""
        tx = run.transaction
        error: Exception | None = None
        child = None
        try:
            delivery = run.delivery  # a job refused by its cap comes back to this queue
            queue = delivery.queue or self.app.conf.task_default_queue or "default"
            run.held = admit(run.task, run.envelope, delivery.unique_key, queue)  # or wait
            run.marker = self._mark_running(run)
            with (
                running_job(self.cancels, tx.cursor, run.envelope, run.delivery),
                handler_publishes(tx.cursor, run.envelope.job_id, run.delivery.consumer),
                batch_child(run.delivery.headers) as child,
                run.marker.reporting(),
            ):
                result = run.task.execute(run.envelope, tx.cursor)
            record_output(
                tx.cursor,
                run.job,
                run.delivery.consumer,
                result,
                max_bytes=self.settings.job_output_max_bytes,
            )
        except Throttled as exc:
            tx.rollback()
            if run.counted:
                self.state.undo(run.delivery.consumer, run.job)
            return ThrottledUntil(exc.retry_at, run.attempt, exc.reason)
        except Exception as exc:
            # the platform's own server calls inside the run (the rate limits of a
            # NotificationTask) and a lost PostgreSQL connection wait; the rest failed
            if isinstance(exc, ServersUnavailable) or tx.server_gone(exc):
                raise
            error = exc
        if error is None:
            error = tx.broken()
        if error is None:
            # a batch child's ending counts beside the idempotency row (an error raises to
            # a Wait), sent with the COMMIT unless it may complete the batch
            if child is not None and count_applied_with_commit(
                tx.cursor, run.envelope.job_id, child
            ):
                error = tx.committed()
            else:
                if child is not None:
                    count_applied(tx.cursor, run.envelope.job_id, child, self.port)
                error = tx.commit()
            if error is None:
                return Applied(run.attempt, result, tracked=run.state.tracked)
        # counted while the claim holds copies back; a refusal raises out to a Wait
        self.state.failed(run.delivery.consumer, run.job, ttl_seconds=run.ttl_seconds)
        return self.counted_failure(run, run.attempt, error)

    def _mark_running(self, run: Run) -> JobMarker:
        """The job's place among the running jobs, now that it was admitted (its marker is
        written if it runs long; ``run.end`` finishes it after the transaction ended)."""
        marker = JobMarker(self.markers, run.job)
        ttl = getattr(run.task, "time_limit", None) or self.settings.visibility_timeout_seconds
        marker.start(
            consumer=run.delivery.consumer,
            queue=run.delivery.queue,
            attempt=run.attempt,
            ttl_seconds=int(ttl),
        )
        return marker

    def _wait(self, run: Run, exc: Exception) -> Wait:
        """A platform step failed (not the handler: its errors are settled in :meth:`_run`).

        An outage waits; anything else waits too, loudly, rather than ack the job.
        """
        if not isinstance(exc, INFRASTRUCTURE_ERRORS):
            logger.error(
                "a consumer step failed (%s); the delivery waits",
                describe(exc),
                exc_info=True,
                extra={"event": "consumer.step_failed", "job_id": run.job},
            )
        self.database.discard()
        if run.counted:
            self.state.undo(run.delivery.consumer, run.job)
        return Wait(describe(exc), outage=isinstance(exc, INFRASTRUCTURE_ERRORS))

    def counted_failure(self, run: Run, attempt: int, exc: Exception) -> Verdict:
        """Attempt ``attempt`` failed with ``exc`` and is counted: retry it or dead-letter."""
        tx = run.transaction
        decision = decide(run.policy, attempt, exc, tuple(run.task.permanent_errors or ()))
        if decision.retry:
            tx.rollback()
            assert decision.delay is not None
            return RetryAt(self.clock() + decision.delay, attempt, exc)
        record = job_record(
            run.envelope,
            run.delivery,
            attempts=attempt,
            reason=decision.reason,
            last_error=describe_error(exc),
            error_type=error_type_name(exc),
        )
        # Written while this transaction still holds the claim, so a copy of the job that
        # waits on it finds the budget spent and the dead letter committed once it gets
        # the claim: it is a duplicate, never a second run and a second row. The handler's
        # work is rolled back after; the row goes through the marks' own connection.
        self.state.exhaust(run.delivery.consumer, run.job, ttl_seconds=run.ttl_seconds)
        written = self.writer.write(record, Mode.BESIDE)
        tx.rollback()
        if isinstance(written, int):
            return GaveUp(record, exc, claim=False, row=written)
        assert written is not None, "only a claimed write finds the job applied"
        return written  # this generation of the job was dead-lettered already

    # -- settling ---------------------------------------------------------------------

    def settle(
        self, task: Any, delivery: Delivery, envelope: Envelope[Any] | None, verdict: Verdict
    ) -> Any:
        """Act on the verdict: what Celery sees is the return value or the raise."""
        if isinstance(verdict, Applied):
            assert envelope is not None
            if verdict.tracked:  # most jobs never had a hash: nothing to clear
                self.state.forget(delivery.consumer, str(envelope.job_id))
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
            self._store_retry(delivery, envelope, verdict.at, attempt, self._why(delivery, verdict))
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
        written: Written = verdict.row  # set: written while the delivery held the claim
        if written is None:
            if envelope is not None:
                self.state.exhaust(
                    delivery.consumer,
                    str(envelope.job_id),
                    ttl_seconds=self._ttl(self._policy(delivery)),
                )
            claimed = verdict.claim and envelope is not None
            written = self.writer.write(
                record, Mode.CLAIMED if claimed else Mode.ALONE, delivery.consumer
            )
        if not isinstance(written, int):  # applied or dead-lettered by another copy
            self.hooks.emit(
                "on_duplicate", delivery, envelope, written or Duplicate("applied_by_other")
            )
            return None
        self.hooks.emit("on_dead_lettered", record, written, verdict.error)
        raise DeadLettered(
            f"dead-lettered as row {written} ({record.reason} after {record.attempts} "
            f"attempt(s)): {record.error_type or 'error'}",
            written,
        ) from None

    def _why(self, delivery: Delivery, verdict: RetryAt | ThrottledUntil) -> dict[str, Any]:
        """Why the job waits, for ``jobs show`` (:data:`DELAY_REASON_HEADER`)."""
        if isinstance(verdict, RetryAt):
            return {"why": "retry", "max": self._policy(delivery).max_attempts}
        why = "concurrency_cap" if verdict.reason == CAP_REASON else "throttle"
        return {"why": why, "detail": verdict.reason}

    def _store_retry(
        self,
        delivery: Delivery,
        envelope: Envelope[Any],
        run_at: datetime,
        attempt: int,
        why: dict[str, Any],
    ) -> None:
        opts: dict[str, Any] = {"attempt": attempt}
        # trace context and custom headers survive the retry; why it waits is said anew
        opts["headers"] = {**(delivery.headers or {}), DELAY_REASON_HEADER: why}
        if delivery.priority is not None:
            opts["priority"] = delivery.priority
        if delivery.unique_key is not None:  # a job put back to wait still holds its key
            opts["headers"] = {**opts.get("headers", {}), UNIQUE_HEADER: delivery.unique_key}
        queue = delivery.queue or self.app.conf.task_default_queue or "default"
        until_done(
            lambda: self.port().schedule(queue, envelope.to_message(), run_at, opts),
            "store the retry",
            self._sleep or time.sleep,
        )

    def _policy(self, delivery: Delivery) -> RetryPolicy:
        policy: RetryPolicy = self.app.retry_policy_for(delivery.queue)
        return policy

    def _ttl(self, policy: RetryPolicy) -> int:
        return delivery_ttl_seconds(policy, self.settings.visibility_timeout_seconds)


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


def _open_pipeline(app: PlatformCelery) -> DeliveryPipeline:
    pipeline = DeliveryPipeline.for_app(app, require_database_url(app.platform_settings))
    configure_alerts(app.platform_settings.sentry_dsn)
    return pipeline


_pipelines: ProcessState[DeliveryPipeline] = ProcessState(
    "platform_pipeline", _open_pipeline, DeliveryPipeline.close
)
"""This process's pipeline per app; ``app.close()`` closes it (an app made at run time, a
test's, would otherwise keep its consumer's PostgreSQL sessions open until the process
exits; a later job of the same app opens a new pipeline)."""


def pipeline_for(app: PlatformCelery) -> DeliveryPipeline:
    """This process's pipeline for ``app`` (created on first use, again after a fork).

    Raises :class:`~platform_tasks.errors.ConfigurationError` naming
    ``PLATFORM_DATABASE_URL`` when it is not set.
    """
    return _pipelines.get(app)
