"""OpenTelemetry for workers: a tracer in each pool process, and the job's facts on its span.

``opentelemetry-instrumentation-celery`` makes a span per publish and per run, and reads
the parent from the message's ``traceparent``; the platform keeps that header on every
message it builds for the job (see :mod:`~platform_tasks.observability.trace_context`),
so retries and replays stay in the publishing request's trace.
:class:`~platform_tasks.consumer.span_hooks.SpanHook` adds
what only the platform knows to the run span: ``correlation_id``, the attempt, and an
error status on an attempt that failed and will be retried (Celery sees a retry, not a
failure, so the instrumentation alone would leave that span "unset").

:func:`trace_workers` is the set-up the OpenTelemetry documentation gives for Celery, in
one call from the app module: a tracer provider with the OTLP/HTTP exporter in every
pool process (``worker_process_init``; a batch exporter's thread does not survive a
fork), configured by the standard ``OTEL_*`` variables (``OTEL_SERVICE_NAME``,
``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_BSP_SCHEDULE_DELAY`` ...). Everything here needs
the ``otel`` extra; without it no span hook is added and the platform runs as before.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals

from platform_tasks.errors import ConfigurationError

__all__ = ["configure_tracing", "trace_workers"]

logger = logging.getLogger(__name__)

ATTEMPT_ATTRIBUTE = "platform.attempt"
CORRELATION_ATTRIBUTE = "correlation_id"
OTEL_EXTRA_HINT = "install the otel extra: pip install 'platform-tasks[otel]'"


def trace_api() -> Any:
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace


_provider: Any = None


def configure_tracing() -> Any:
    """A tracer provider exporting over OTLP/HTTP, set globally, and Celery instrumented.

    The resource, endpoint, headers and batching come from the ``OTEL_*`` variables, as
    every OpenTelemetry SDK reads them. Returns the provider (once per process).
    """
    global _provider
    if _provider is not None:
        return _provider
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigurationError(f"tracing workers: {exc}; {OTEL_EXTRA_HINT}") from None
    provider = TracerProvider(resource=Resource.create())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]
    _provider = provider
    logger.info("tracing with OpenTelemetry (OTLP/HTTP)", extra={"event": "tracing.configured"})
    return provider


def _flush(**_: Any) -> None:
    if _provider is not None:
        _provider.shutdown()


def _in_pool_process(**_: Any) -> None:
    configure_tracing()


def _in_worker(sender: Any = None, **_: Any) -> None:
    pool = getattr(sender, "pool_cls", None)
    name = f"{getattr(pool, '__module__', '')}.{getattr(pool, '__name__', pool)}".lower()
    if "prefork" not in name and "processes" not in name:  # solo/threads: runs jobs here
        configure_tracing()


def trace_workers() -> None:
    """Trace every worker of this process's apps: call once in the app module.

    Prefork pool processes set up tracing when they start; ``-P solo`` and ``-P threads``
    workers in their one process. Spans are flushed when a pool process exits.
    """
    if trace_api() is None:
        raise ConfigurationError(f"trace_workers() needs OpenTelemetry; {OTEL_EXTRA_HINT}")
    connections = (
        (signals.worker_process_init, _in_pool_process, "pool"),
        (signals.worker_init, _in_worker, "worker"),
        (signals.worker_process_shutdown, _flush, "flush_pool"),
        (signals.worker_shutdown, _flush, "flush_worker"),
    )
    for signal, receiver, name in connections:
        signal.connect(receiver, weak=False, dispatch_uid=f"platform_tasks.tracing.{name}")
