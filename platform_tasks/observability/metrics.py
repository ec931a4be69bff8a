"""Consumer counters: successes are metrics, not rows.

Counters (all labelled by ``queue`` and ``task``):

- ``platform_jobs_processed_total`` — handler ran and its transaction committed
- ``platform_jobs_duplicate_skipped_total`` — delivery of an already applied job, skipped
- ``platform_jobs_retried_total`` — failed attempt rescheduled through the delay store
- ``platform_jobs_dead_lettered_total`` — written to core.dead_letters (label ``reason``)
- ``platform_jobs_poison_total`` — schema-invalid envelope or a message Celery would drop
- ``platform_jobs_throttled_total`` — rescheduled without spending an attempt (label ``reason``)

Labels come only from what the application declared: a task label is a registered task
name and a queue label a queue the app knows (declared queues, retry policies, the
default queue, tasks' own ``queue`` options); anything else, such as the kind or routing
key of a poison or dropped message, is counted as ``unknown``, so producers cannot create
unbounded series.

Prefork workers: set ``PROMETHEUS_MULTIPROC_DIR`` to an empty, writable directory in the
worker's environment (before it starts; prometheus-client reads it at import) and set
``PLATFORM_METRICS_PORT``. Every pool process then writes its counters to that directory
and the worker's main process serves the sum of all of them on
``http://<host>:<PLATFORM_METRICS_PORT>/metrics``. Without ``PROMETHEUS_MULTIPROC_DIR``
the endpoint shows only the main process (fine for ``-P solo``/``threads``). Clear the
directory between worker restarts, as prometheus-client documents.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import bootsteps, signals
from prometheus_client import CollectorRegistry, Counter

from platform_tasks.app_state import AppState
from platform_tasks.observability.metrics_server import MetricsServer, serve

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery


_LABELS = ("queue", "task")

PROCESSED = Counter("platform_jobs_processed", "Jobs applied and committed.", _LABELS)
DUPLICATE_SKIPPED = Counter(
    "platform_jobs_duplicate_skipped", "Deliveries of already applied jobs, skipped.", _LABELS
)
RETRIED = Counter("platform_jobs_retried", "Failed attempts rescheduled with backoff.", _LABELS)
DEAD_LETTERED = Counter(
    "platform_jobs_dead_lettered", "Jobs written to core.dead_letters.", (*_LABELS, "reason")
)
POISON = Counter(
    "platform_jobs_poison", "Invalid envelopes and messages Celery would drop.", _LABELS
)


THROTTLED = Counter(
    "platform_jobs_throttled",
    "Jobs rescheduled without spending an attempt.",
    (*_LABELS, "reason"),
)


def registry_for_exposition() -> CollectorRegistry | None:
    """The registry to serve: the multiprocess sum under prefork, else the default one."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


ExpositionRegistrar = Callable[["PlatformCelery", CollectorRegistry | None], object]
"""Called as ``register(app, registry)`` when the worker starts serving ``/metrics``:
adds collectors to ``registry`` (``None``: the global one), like the queue gauges of
:mod:`platform_tasks.brokers.queue_latency`."""

_REGISTRARS: AppState[list[ExpositionRegistrar]] = AppState("platform_metric_registrars")
"""Kept on the app so this module needs no import of the layers above it."""


def add_exposition_registrar(app: PlatformCelery, register: ExpositionRegistrar) -> None:
    """Have ``register(app, registry)`` called when ``app``'s worker serves ``/metrics``."""
    registrars = list(_REGISTRARS.get(app) or ())
    if register not in registrars:
        registrars.append(register)
    _REGISTRARS.set(app, registrars)


class MetricsServerStep(bootsteps.StartStopStep):
    """Worker bootstep: serves ``/metrics`` on ``PLATFORM_METRICS_PORT`` when it is set
    (:func:`~platform_tasks.observability.metrics_server.serve`, as beat does)."""

    label = "platform metrics"
    server: MetricsServer | None = None

    def start(self, worker: Any) -> None:
        port = worker.app.platform_settings.metrics_port
        if port is None:
            return
        registry = registry_for_exposition()
        for register in _REGISTRARS.get(worker.app) or ():
            register(worker.app, registry)
        self.server = serve(port, role="worker", registry=registry)

    def stop(self, worker: Any) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def _mark_process_dead(pid: int | None = None, **_: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())  # type: ignore[no-untyped-call]


def install(app: PlatformCelery) -> None:
    """Serve metrics from every worker of ``app`` and tidy up after exiting pool processes."""
    app.steps["worker"].add(MetricsServerStep)
    signals.worker_process_shutdown.connect(
        _mark_process_dead,
        weak=False,
        dispatch_uid="platform_tasks.observability.metrics.mark_dead",
    )
