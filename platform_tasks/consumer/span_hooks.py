"""The job's facts on its run span: ``correlation_id``, the attempt, and an error status
on an attempt that failed and will be retried (Celery sees a retry, not a failure, so
``opentelemetry-instrumentation-celery`` alone would leave that span "unset").

A pipeline hook, installed by ``create_app``; without the ``otel`` extra it adds nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from platform_tasks.consumer.hooks import PipelineHook, add_hook
from platform_tasks.observability.tracing import ATTEMPT_ATTRIBUTE, CORRELATION_ATTRIBUTE, trace_api

if TYPE_CHECKING:
    from platform_tasks.consumer.delivery import Delivery
    from platform_tasks.consumer.verdicts import Applied, Duplicate, RetryAt, ThrottledUntil
    from platform_tasks.dead_letters.dead_letter import DeadLetter
    from platform_tasks.envelope import Envelope
    from platform_tasks.kernel import PlatformCelery

__all__ = ["SpanHook", "install", "span_hooks"]


class SpanHook(PipelineHook):
    """Puts the platform's facts on the current span (the run span under the instrumentation)."""

    def __init__(self, trace: Any) -> None:
        self._trace = trace

    def _span(self) -> Any:
        span = self._trace.get_current_span()
        return span if span.is_recording() else None

    def on_started(self, delivery: Delivery, envelope: Envelope[Any]) -> None:
        span = self._span()
        if span is not None:
            span.set_attribute(CORRELATION_ATTRIBUTE, envelope.correlation_id)
            span.set_attribute("platform.kind", envelope.kind)
            span.set_attribute("platform.tenant_id", envelope.tenant_id)
            if delivery.queue:
                span.set_attribute("platform.queue", delivery.queue)

    def on_applied(self, delivery: Delivery, envelope: Envelope[Any], verdict: Applied) -> None:
        span = self._span()
        if span is not None:
            span.set_attribute(ATTEMPT_ATTRIBUTE, verdict.attempt)

    def on_duplicate(self, delivery: Delivery, envelope: Envelope[Any], verdict: Duplicate) -> None:
        span = self._span()
        if span is not None:
            span.set_attribute("platform.duplicate", verdict.reason)

    def on_retry_scheduled(
        self, delivery: Delivery, envelope: Envelope[Any], verdict: RetryAt
    ) -> None:
        span = self._span()
        if span is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_attribute(ATTEMPT_ATTRIBUTE, verdict.attempt)
            span.set_attribute("platform.retry_at", verdict.at.isoformat())
            span.record_exception(verdict.error)
            span.set_status(Status(StatusCode.ERROR, f"attempt {verdict.attempt} failed"))

    def on_throttled(
        self, delivery: Delivery, envelope: Envelope[Any], verdict: ThrottledUntil
    ) -> None:
        span = self._span()
        if span is not None:
            span.set_attribute(ATTEMPT_ATTRIBUTE, verdict.attempt)
            span.add_event(
                "platform.throttled", {"reason": verdict.reason, "retry_at": verdict.at.isoformat()}
            )

    def on_dead_lettered(
        self, record: DeadLetter, dead_letter_id: int, error: BaseException | None
    ) -> None:
        span = self._span()
        if span is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_attribute(ATTEMPT_ATTRIBUTE, record.attempts)
            span.set_attribute("platform.dead_letter_id", dead_letter_id)
            if error is not None:
                span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"dead-lettered ({record.reason})"))


def span_hooks() -> list[PipelineHook]:
    """``[SpanHook]`` when the OpenTelemetry API is installed, else nothing."""
    trace = trace_api()
    return [SpanHook(trace)] if trace is not None else []


def install(app: PlatformCelery) -> None:
    """Add the span hook to ``app``'s delivery pipeline when OpenTelemetry is installed."""
    for hook in span_hooks():
        add_hook(app, hook)
