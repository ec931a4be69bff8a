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
from collections.abc import Sequence
from typing import Any

from platform_tasks.consumer.dead_letter_records import DeadLetterRecord
from platform_tasks.consumer.delivery import Delivery
from platform_tasks.consumer.verdicts import Applied, Duplicate, RetryAt, ThrottledUntil
from platform_tasks.envelope import Envelope

logger = logging.getLogger(__name__)

_HOOKS_ATTRIBUTE = "platform_pipeline_hooks"


class PipelineHook:
    """No-op base: one method per outcome of a delivery."""

    def on_started(self, delivery: Delivery, envelope: Envelope[Any]) -> None:
        """A valid envelope was received; deciding its outcome starts."""

    def on_applied(self, delivery: Delivery, envelope: Envelope[Any], verdict: Applied) -> None:
        """The handler's work committed."""

    def on_duplicate(self, delivery: Delivery, envelope: Envelope[Any], verdict: Duplicate
                     ) -> None:  # fmt: skip
        """The delivery was skipped: applied or dead-lettered before."""

    def on_retry_scheduled(self, delivery: Delivery, envelope: Envelope[Any], verdict: RetryAt
                           ) -> None:  # fmt: skip
        """A failed attempt was rescheduled through the delay store."""

    def on_throttled(self, delivery: Delivery, envelope: Envelope[Any],
                     verdict: ThrottledUntil) -> None:  # fmt: skip
        """The job was rescheduled without spending an attempt."""

    def on_dead_lettered(self, record: DeadLetterRecord, dead_letter_id: int,
                         error: BaseException | None) -> None:  # fmt: skip
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
                logger.exception("pipeline hook %s.%s failed", type(hook).__name__, method,
                                 extra={"event": "consumer.hook_failed"})  # fmt: skip


def add_hook(app: Any, hook: PipelineHook) -> None:
    """Install ``hook`` on ``app``'s delivery pipeline (after the hooks already there)."""
    hooks_of(app).append(hook)


def hooks_of(app: Any) -> list[PipelineHook]:
    hooks: list[PipelineHook] | None = getattr(app, _HOOKS_ATTRIBUTE, None)
    if hooks is None:
        hooks = []
        setattr(app, _HOOKS_ATTRIBUTE, hooks)
    return hooks


class LogHook(PipelineHook):
    """Structured log lines for each outcome; ``data`` is never logged (redacted envelope)."""

    def on_applied(self, delivery: Delivery, envelope: Envelope[Any], verdict: Applied) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            _log(logging.DEBUG, "job applied", "consumer.applied", envelope, delivery,
                 attempt=verdict.attempt)  # fmt: skip

    def on_duplicate(self, delivery: Delivery, envelope: Envelope[Any], verdict: Duplicate
                     ) -> None:  # fmt: skip
        if verdict.reason == "dead_lettered":
            _log(logging.INFO, "job already dead-lettered; delivery dropped",
                 "consumer.already_dead_lettered", envelope, delivery,
                 dead_letter_id=verdict.dead_letter_id)  # fmt: skip
        else:
            _log(logging.INFO, "duplicate delivery skipped", "consumer.duplicate_skipped",
                 envelope, delivery, reason=verdict.reason)  # fmt: skip

    def on_retry_scheduled(self, delivery: Delivery, envelope: Envelope[Any], verdict: RetryAt
                           ) -> None:  # fmt: skip
        from platform_tasks.consumer.dead_letter_records import error_type_name

        _log(logging.WARNING, "attempt failed; retry scheduled", "consumer.retry_scheduled",
             envelope, delivery, attempt=verdict.attempt, retry_at=verdict.at.isoformat(),
             error_type=error_type_name(verdict.error))  # fmt: skip

    def on_throttled(self, delivery: Delivery, envelope: Envelope[Any],
                     verdict: ThrottledUntil) -> None:  # fmt: skip
        _log(logging.INFO, "job throttled; rescheduled without spending an attempt",
             "consumer.throttled", envelope, delivery, attempt=verdict.attempt,
             retry_at=verdict.at.isoformat(), reason=verdict.reason)  # fmt: skip

    def on_dead_lettered(self, record: DeadLetterRecord, dead_letter_id: int,
                         error: BaseException | None) -> None:  # fmt: skip
        logger.error(
            "job dead-lettered (%s) as row %s", record.reason, dead_letter_id,
            extra={"event": "consumer.dead_lettered",
                   "job_id": str(record.job_id) if record.job_id else None,
                   "queue": record.queue, "kind": record.kind, "tenant_id": record.tenant_id,
                   "correlation_id": record.correlation_id, "attempts": record.attempts,
                   "reason": record.reason, "dead_letter_id": dead_letter_id},
        )  # fmt: skip


class AlertHook(PipelineHook):
    """One alert per dead letter, grouped by queue + kind + error type."""

    def on_dead_lettered(self, record: DeadLetterRecord, dead_letter_id: int,
                         error: BaseException | None) -> None:  # fmt: skip
        record.alert(dead_letter_id, error)


def _log(level: int, message: str, event: str, envelope: Envelope[Any], delivery: Delivery,
         **fields: Any) -> None:  # fmt: skip
    logger.log(level, "%s: %s", message, envelope.redacted(),
               extra={"event": event, "job_id": str(envelope.job_id), "queue": delivery.queue,
                      "kind": envelope.kind, "tenant_id": envelope.tenant_id,
                      "correlation_id": envelope.correlation_id, **fields})  # fmt: skip


def install(app: Any) -> None:
    """Structured logs, alerts and metrics on ``app``'s delivery pipeline."""
    from platform_tasks.metrics import MetricsHook
    from platform_tasks.observability.tracing import span_hooks

    for hook in (LogHook(), AlertHook(), MetricsHook(app), *span_hooks()):
        add_hook(app, hook)
