"""The checks a claimed delivery passes before its handler runs, in order.

Each gate looks at the :class:`Run` (the job claimed in its transaction) and returns a
:mod:`verdict <platform_tasks.consumer.verdicts>` that ends the delivery without running
the handler, or ``None`` to let it go on, as dramatiq's ``before_process_message``
middleware raises ``SkipMessage``. A gate may also note what it learnt on the run (the
job's delivery state, the attempt it is on). An exception raised by a gate is a platform
step that failed: the delivery waits (:class:`~platform_tasks.consumer.verdicts.Wait`),
and the transaction is rolled back by the caller whatever happens.

:data:`BEFORE_RUN`, in order:

1. :func:`cancelled` — an operator's cancel rule matches the job (judged by its carried
   publish time, :mod:`platform_tasks.consumer.cancels`);
2. :func:`read_state` — ask Redis about the job: a redelivery (its worker died) is
   counted there so crash loops end; a first delivery reads the attempts already spent,
   and only when the claim saw a delivery mark (see :mod:`~platform_tasks.consumer.marks`);
3. :func:`stopped_at_time_limit` — the pool killed the previous delivery at its hard time
   limit: that attempt failed, settled without running the handler again;
4. :func:`over_budget` — past ``max_attempts``: a replayed dead letter starts over, a
   job already dead-lettered is a duplicate, anything else is a crash loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from platform_tasks.consumer.attempts import UNTRACKED, DeliveryState, attempt_number
from platform_tasks.consumer.cancels import cancel_delivery
from platform_tasks.consumer.dead_letter_writer import job_record
from platform_tasks.consumer.delivery import Delivery
from platform_tasks.consumer.retry import CRASH_LOOP, RetryPolicy
from platform_tasks.consumer.transaction import JobTransaction
from platform_tasks.consumer.verdicts import Duplicate, GaveUp, Verdict
from platform_tasks.dead_letters.records import latest_dead_letter
from platform_tasks.envelope import Envelope
from platform_tasks.errors import HardTimeLimitExceeded
from platform_tasks.jobs_status.running import JobMarker
from platform_tasks.limits.admission import NOTHING_HELD, Admitted

if TYPE_CHECKING:
    from platform_tasks.consumer.pipeline import DeliveryPipeline

logger = logging.getLogger(__name__)


@dataclass
class Run:
    """One try at a delivery: what the gates and the run step share."""

    task: Any
    envelope: Envelope[Any]
    delivery: Delivery
    policy: RetryPolicy
    ttl_seconds: int
    tx: JobTransaction | None = None
    marked: bool = False
    """Whether the claim saw a delivery mark for the job."""
    state: DeliveryState = UNTRACKED
    attempt: int = 1
    counted: bool = False
    """Whether this delivery's redelivery count stands in Redis (taken back on a wait)."""
    held: Admitted = field(default_factory=lambda: NOTHING_HELD)
    """The limits the job holds while it runs, released after its transaction ended."""
    marker: JobMarker | None = None
    """The job's running marker once it was admitted, deleted after its transaction ended."""

    @property
    def job(self) -> str:
        return str(self.envelope.job_id)

    @property
    def transaction(self) -> JobTransaction:
        assert self.tx is not None, "the job is claimed before any gate runs"
        return self.tx

    def end(self) -> None:
        """Roll back what is still open, then free the limits (never raises)."""
        if self.tx is not None:
            self.tx.end()
        if self.marker is not None:  # after the commit: "running" is followed by "applied"
            self.marker.end()
        self.held.release()  # after the commit: a slot frees once the job's work is visible


Gate = Callable[["DeliveryPipeline", Run], Verdict | None]


def cancelled(pipeline: DeliveryPipeline, run: Run) -> Verdict | None:
    """An operator cancelled the job (``platform-tasks jobs cancel``): committed, not run."""
    return cancel_delivery(
        pipeline.cancels, run.transaction, run.envelope, run.delivery, port=pipeline.port
    )


def read_state(pipeline: DeliveryPipeline, run: Run) -> Verdict | None:
    """Note the job's delivery state and the attempt it is on (a redelivery counted)."""
    delivery = run.delivery
    if delivery.redelivered or run.marked or not pipeline.skip_unmarked_reads:
        run.state = pipeline.state.read(
            delivery.consumer, run.job, redelivered=delivery.redelivered, ttl=run.ttl_seconds
        )  # else no mark: nothing of this job's is in Redis, the state stays untracked
    run.counted = delivery.redelivered
    run.attempt = attempt_number(delivery.header_attempt, run.state.spent)
    return None


def stopped_at_time_limit(pipeline: DeliveryPipeline, run: Run) -> Verdict | None:
    """The previous delivery was killed at its hard time limit: settle that attempt."""
    state, delivery = run.state, run.delivery
    if state.time_limit is None or not delivery.redelivered or state.exhausted:
        return None
    stopped = attempt_number(delivery.header_attempt, state.spent - 1)
    pipeline.state.settle_time_limit(delivery.consumer, run.job, ttl_seconds=run.ttl_seconds)
    run.counted = False  # the count now stands for the stopped attempt
    return pipeline.counted_failure(run, stopped, HardTimeLimitExceeded(state.time_limit, stopped))


def over_budget(pipeline: DeliveryPipeline, run: Run) -> Verdict | None:
    """Past the budget: a replay starts over at attempt 1, else a verdict."""
    state, envelope, delivery = run.state, run.envelope, run.delivery
    if not (state.exhausted or run.attempt > run.policy.max_attempts):
        return None
    latest = latest_dead_letter(run.transaction.cursor, envelope.job_id, envelope.kind)
    if latest is not None:
        dead_letter_id, status = latest
        if status == "replayed" and state.generation != dead_letter_id:
            pipeline.state.restart(
                delivery.consumer, run.job, generation=dead_letter_id, ttl_seconds=run.ttl_seconds
            )
            _log_replay(run, dead_letter_id)
            run.attempt = 1
            return None
        if status != "replayed":
            return Duplicate("dead_lettered", dead_letter_id)
    attempts = max(0, run.attempt - 1)
    record = job_record(
        envelope,
        delivery,
        attempts=attempts,
        reason=CRASH_LOOP,
        error_type="CrashLoop",
        last_error=(
            f"crash loop: delivered {run.attempt} times, {attempts} of them started the "
            f"handler without finishing (worker killed?); max_attempts is "
            f"{run.policy.max_attempts}"
        ),
    )
    return GaveUp(record, None)


BEFORE_RUN: tuple[Gate, ...] = (cancelled, read_state, stopped_at_time_limit, over_budget)
"""The gates of every delivery, in the order they run (see the module)."""


def _log_replay(run: Run, dead_letter_id: int) -> None:
    logger.info(
        "replay of a dead letter: attempts start over: %s",
        run.envelope.redacted(),
        extra={
            "event": "consumer.replay_started",
            "job_id": run.job,
            "queue": run.delivery.queue,
            "kind": run.envelope.kind,
            "dead_letter_id": dead_letter_id,
        },
    )
