"""What each delivery of a test's jobs came to: the outcome recorder of the pytest kit.

:class:`OutcomeRecorder` is a pipeline hook that keeps one :class:`JobOutcome` per
delivery, so :class:`~platform_tasks.testing.consumer.PlatformJobs` can wait for a job's
verdict instead of sleeping. Both names are importable from
``platform_tasks.testing.consumer`` as before.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from platform_tasks.app_state import AppState
from platform_tasks.consumer.delivery import Delivery
from platform_tasks.consumer.hooks import PipelineHook, add_hook
from platform_tasks.consumer.verdicts import Applied, Duplicate, RetryAt, ThrottledUntil
from platform_tasks.dead_letters.dead_letter import DeadLetter
from platform_tasks.envelope import Envelope

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

__all__ = ["JobOutcome", "OutcomeRecorder", "RecordedDelivery", "Status", "install_recorder"]

Status = Literal["applied", "duplicate", "dead_lettered", "retry_scheduled", "throttled"]


@dataclass(frozen=True)
class JobOutcome:
    """What one delivery of a job came to.

    ``status``: ``applied`` (work and idempotency row committed; ``processed_at`` is the
    row's time), ``duplicate`` (skipped; ``reason`` is ``applied``, ``dead_lettered`` or
    ``applied_by_other``), ``dead_lettered`` (``dead_letter`` is the ``core.dead_letters``
    row as a dict, ``reason`` its reason), ``retry_scheduled`` (attempt ``attempt``
    failed with ``error_type``; the next one waits in the delay store until
    ``retry_at``) or ``throttled`` (the same attempt again at ``retry_at``).
    """

    status: Status
    job_id: uuid.UUID | None
    attempt: int | None = None
    reason: str | None = None
    retry_at: datetime | None = None
    error_type: str | None = None
    processed_at: datetime | None = None
    dead_letter: dict[str, Any] | None = None
    consumer: str | None = None


@dataclass
class RecordedDelivery:
    status: Status
    job_id: uuid.UUID | None
    consumer: str | None = None
    attempt: int | None = None
    reason: str | None = None
    retry_at: datetime | None = None
    error_type: str | None = None
    dead_letter_id: int | None = None


class OutcomeRecorder(PipelineHook):
    """A pipeline hook that records each settled delivery per job id, in order.

    The worker thread records; test threads wait on the condition for the next outcome
    of a job they have not seen yet.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._events: dict[uuid.UUID | None, list[RecordedDelivery]] = {}

    def _record(self, event: RecordedDelivery) -> None:
        with self._condition:
            self._events.setdefault(event.job_id, []).append(event)
            self._condition.notify_all()

    def clear(self) -> None:
        with self._condition:
            self._events.clear()

    def events(self, job_id: uuid.UUID | None) -> list[RecordedDelivery]:
        with self._condition:
            return list(self._events.get(job_id, ()))

    def wait_for(self, job_id: uuid.UUID, index: int, deadline: float) -> RecordedDelivery | None:
        """The job's ``index``-th recorded outcome, waiting for it until ``deadline``."""
        with self._condition:
            while True:
                events = self._events.get(job_id, [])
                if len(events) > index:
                    return events[index]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._condition.wait(remaining)

    def on_applied(self, delivery: Delivery, envelope: Envelope[Any], verdict: Applied) -> None:
        self._record(
            RecordedDelivery("applied", envelope.job_id, delivery.consumer, verdict.attempt)
        )

    def on_duplicate(self, delivery: Delivery, envelope: Envelope[Any], verdict: Duplicate) -> None:
        self._record(
            RecordedDelivery(
                "duplicate",
                envelope.job_id,
                delivery.consumer,
                reason=verdict.reason,
                dead_letter_id=verdict.dead_letter_id,
            )
        )

    def on_retry_scheduled(
        self, delivery: Delivery, envelope: Envelope[Any], verdict: RetryAt
    ) -> None:
        from platform_tasks.dead_letters.records import error_type_name

        self._record(
            RecordedDelivery(
                "retry_scheduled",
                envelope.job_id,
                delivery.consumer,
                verdict.attempt,
                retry_at=verdict.at,
                error_type=error_type_name(verdict.error),
            )
        )

    def on_throttled(
        self, delivery: Delivery, envelope: Envelope[Any], verdict: ThrottledUntil
    ) -> None:
        self._record(
            RecordedDelivery(
                "throttled",
                envelope.job_id,
                delivery.consumer,
                verdict.attempt,
                reason=verdict.reason,
                retry_at=verdict.at,
            )
        )

    def on_dead_lettered(
        self, record: DeadLetter, dead_letter_id: int, error: BaseException | None
    ) -> None:
        self._record(
            RecordedDelivery(
                "dead_lettered",
                record.job_id,
                record.kind,
                record.attempts,
                reason=record.reason,
                error_type=record.error_type,
                dead_letter_id=dead_letter_id,
            )
        )


_RECORDER: AppState[OutcomeRecorder] = AppState("platform_test_outcomes")


def install_recorder(app: PlatformCelery) -> OutcomeRecorder:
    """The app's :class:`OutcomeRecorder`, installed as a pipeline hook on first call.

    Install it before the app's first delivery in this process: the pipeline reads its
    hooks when it is created.
    """
    recorder = _RECORDER.get(app)
    if recorder is None:
        recorder = OutcomeRecorder()
        add_hook(app, recorder)
        _RECORDER.set(app, recorder)
    return recorder
