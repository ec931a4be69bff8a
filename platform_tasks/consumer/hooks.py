"""Side concerns of the delivery pipeline as hook objects: logs, alerts, metrics.

:class:`PipelineHook` has one no-op method per outcome (dramatiq's ``Middleware``); a
concern overrides the ones it cares about, and :func:`add_hook` installs it on an app
(``create_app`` installs the log, alert and metrics hooks). A new outcome, like the
notification rails' "throttled", reaches every hook without the pipeline knowing who
listens. A hook that raises is logged and skipped: counting or alerting must never turn
a settled delivery into a lost one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from platform_tasks.app_state import AppState
from platform_tasks.consumer.delivery import Delivery
from platform_tasks.consumer.verdicts import Applied, Duplicate, RetryAt, ThrottledUntil
from platform_tasks.dead_letters.dead_letter import DeadLetter
from platform_tasks.dead_letters.records import error_type_name
from platform_tasks.envelope import Envelope
from platform_tasks.observability.metrics import (
    DEAD_LETTERED,
    DUPLICATE_SKIPPED,
    POISON,
    PROCESSED,
    RETRIED,
    THROTTLED,
)

if TYPE_CHECKING:
    from celery import Celery

    from platform_tasks.kernel import PlatformCelery

logger = logging.getLogger(__name__)


class PipelineHook:
    """No-op base: one method per outcome of a delivery."""

    def on_started(self, delivery: Delivery, envelope: Envelope[Any]) -> None:
        """A valid envelope was received; deciding its outcome starts."""

    def on_applied(self, delivery: Delivery, envelope: Envelope[Any], verdict: Applied) -> None:
        """The handler's work committed."""

    def on_duplicate(self, delivery: Delivery, envelope: Envelope[Any], verdict: Duplicate) -> None:
        """The delivery was skipped: applied or dead-lettered before."""

    def on_retry_scheduled(
        self, delivery: Delivery, envelope: Envelope[Any], verdict: RetryAt
    ) -> None:
        """A failed attempt was rescheduled through the delay store."""

    def on_throttled(
        self, delivery: Delivery, envelope: Envelope[Any], verdict: ThrottledUntil
    ) -> None:
        """The job was rescheduled without spending an attempt."""

    def on_dead_lettered(
        self, record: DeadLetter, dead_letter_id: int, error: BaseException | None
    ) -> None:
        """A row was written to ``core.dead_letters`` (by the pipeline or for a dropped message)."""

    def on_waiting(self, delivery: Delivery | None, cause: str) -> None:
        """PostgreSQL or Redis is unavailable; the message waits unacked."""


class Hooks:
    """The hooks of one app, called in order; each call is shielded from the others."""

    def __init__(self, hooks: Sequence[PipelineHook]) -> None:
        self.hooks = list(hooks)

    def emit(self, method: str, *args: Any) -> None:
        for hook in self.hooks:
            try:
                getattr(hook, method)(*args)
            except Exception:
                logger.exception(
                    "pipeline hook %s.%s failed",
                    type(hook).__name__,
                    method,
                    extra={"event": "consumer.hook_failed"},
                )


def add_hook(app: PlatformCelery, hook: PipelineHook) -> None:
    """Install ``hook`` on ``app``'s delivery pipeline (after the hooks already there)."""
    hooks_of(app).append(hook)


_HOOKS: AppState[list[PipelineHook]] = AppState("platform_pipeline_hooks")


def hooks_of(app: PlatformCelery) -> list[PipelineHook]:
    """``app``'s hooks, in the order they are called."""
    return _HOOKS.get_or_set(app, list)


class LogHook(PipelineHook):
    """Structured log lines for each outcome; ``data`` is never logged (redacted envelope)."""

    def on_applied(self, delivery: Delivery, envelope: Envelope[Any], verdict: Applied) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            _log(
                logging.DEBUG,
                "job applied",
                "consumer.applied",
                envelope,
                delivery,
                attempt=verdict.attempt,
            )

    def on_duplicate(self, delivery: Delivery, envelope: Envelope[Any], verdict: Duplicate) -> None:
        if verdict.reason == "dead_lettered":
            _log(
                logging.INFO,
                "job already dead-lettered; delivery dropped",
                "consumer.already_dead_lettered",
                envelope,
                delivery,
                dead_letter_id=verdict.dead_letter_id,
            )
        else:
            _log(
                logging.INFO,
                "duplicate delivery skipped",
                "consumer.duplicate_skipped",
                envelope,
                delivery,
                reason=verdict.reason,
            )

    def on_retry_scheduled(
        self, delivery: Delivery, envelope: Envelope[Any], verdict: RetryAt
    ) -> None:
        _log(
            logging.WARNING,
            "attempt failed; retry scheduled",
            "consumer.retry_scheduled",
            envelope,
            delivery,
            attempt=verdict.attempt,
            retry_at=verdict.at.isoformat(),
            error_type=error_type_name(verdict.error),
        )

    def on_throttled(
        self, delivery: Delivery, envelope: Envelope[Any], verdict: ThrottledUntil
    ) -> None:
        _log(
            logging.INFO,
            "job throttled; rescheduled without spending an attempt",
            "consumer.throttled",
            envelope,
            delivery,
            attempt=verdict.attempt,
            retry_at=verdict.at.isoformat(),
            reason=verdict.reason,
        )

    def on_dead_lettered(
        self, record: DeadLetter, dead_letter_id: int, error: BaseException | None
    ) -> None:
        logger.error(
            "job dead-lettered (%s) as row %s",
            record.reason,
            dead_letter_id,
            extra={
                "event": "consumer.dead_lettered",
                "job_id": str(record.job_id) if record.job_id else None,
                "queue": record.queue,
                "kind": record.kind,
                "tenant_id": record.tenant_id,
                "correlation_id": record.correlation_id,
                "attempts": record.attempts,
                "reason": record.reason,
                "dead_letter_id": dead_letter_id,
            },
        )


class AlertHook(PipelineHook):
    """One alert per dead letter, grouped by queue + kind + error type."""

    def on_dead_lettered(
        self, record: DeadLetter, dead_letter_id: int, error: BaseException | None
    ) -> None:
        record.alert(dead_letter_id, error)


def _log(
    level: int, message: str, event: str, envelope: Envelope[Any], delivery: Delivery, **fields: Any
) -> None:
    logger.log(
        level,
        "%s: %s",
        message,
        envelope.redacted(),
        extra={
            "event": event,
            "job_id": str(envelope.job_id),
            "queue": delivery.queue,
            "kind": envelope.kind,
            "tenant_id": envelope.tenant_id,
            "correlation_id": envelope.correlation_id,
            **fields,
        },
    )


UNKNOWN = "unknown"
POISON_REASONS = frozenset(
    {"poison", "unknown_task", "undecodable_body", "invalid_message", "missing_celery_headers"}
)
"""Dead-letter reasons that also count as poison (never a handler's failure)."""


class MetricsHook(PipelineHook):
    """Prometheus counters for every outcome, labelled only with declared names."""

    def __init__(self, app: Celery) -> None:
        """``app`` may be a plain ``Celery()`` app (celery-exporter's labels of the current
        app): it then has no retry policies to declare queues."""
        self.app = app
        self._processed: dict[tuple[str | None, str, int], Any] = {}
        """``platform_jobs_processed`` children by (queue, task, pid): working the labels
        out walks the app's queues and tasks, once per job before; only declared pairs
        are kept, so the dict is as small as the app."""

    def queue_label(self, queue: str | None) -> str:
        app = self.app
        if not queue:
            return UNKNOWN
        declared = (
            queue in app.amqp.queues
            or queue in (getattr(app, "retry_policies", None) or {})
            or queue == app.conf.task_default_queue
            or any(getattr(task, "queue", None) == queue for task in self._tasks().values())
        )
        return queue if declared else UNKNOWN

    def task_label(self, task: str | None) -> str:
        return task if task and task in self._tasks() else UNKNOWN

    def _tasks(self) -> Mapping[str, Any]:
        try:
            tasks: Mapping[str, Any] = self.app.tasks
        except Exception:  # a task that fails to build on finalize: label nothing by it
            return {}
        return tasks

    def labels(self, queue: str | None, task: str | None) -> dict[str, str]:
        return {"queue": self.queue_label(queue), "task": self.task_label(task)}

    def on_applied(self, delivery: Delivery, envelope: Envelope[Any], verdict: Applied) -> None:
        key = (delivery.queue, delivery.consumer, os.getpid())
        child = self._processed.get(key)
        if child is None:
            labels = self.labels(delivery.queue, delivery.consumer)
            child = PROCESSED.labels(**labels)
            if UNKNOWN not in labels.values():  # an undeclared name may be declared later
                self._processed[key] = child
        child.inc()

    def on_duplicate(self, delivery: Delivery, envelope: Envelope[Any], verdict: Duplicate) -> None:
        DUPLICATE_SKIPPED.labels(**self.labels(delivery.queue, delivery.consumer)).inc()

    def on_retry_scheduled(
        self, delivery: Delivery, envelope: Envelope[Any], verdict: RetryAt
    ) -> None:
        RETRIED.labels(**self.labels(delivery.queue, delivery.consumer)).inc()

    def on_throttled(
        self, delivery: Delivery, envelope: Envelope[Any], verdict: ThrottledUntil
    ) -> None:
        THROTTLED.labels(
            reason=verdict.reason, **self.labels(delivery.queue, delivery.consumer)
        ).inc()

    def on_dead_lettered(
        self, record: DeadLetter, dead_letter_id: int, error: BaseException | None
    ) -> None:
        labels = self.labels(record.queue, record.kind)
        if record.reason in POISON_REASONS:
            POISON.labels(**labels).inc()
        DEAD_LETTERED.labels(reason=record.reason, **labels).inc()


def install(app: PlatformCelery) -> None:
    """Structured logs, alerts and metrics on ``app``'s delivery pipeline."""
    for hook in (LogHook(), AlertHook(), MetricsHook(app)):
        add_hook(app, hook)
