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

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery import bootsteps, signals
from prometheus_client import CollectorRegistry, Counter, start_http_server

from platform_tasks.consumer.hooks import PipelineHook

if TYPE_CHECKING:
    from platform_tasks.consumer.dead_letter_records import DeadLetterRecord
    from platform_tasks.consumer.delivery import Delivery
    from platform_tasks.consumer.verdicts import Applied, Duplicate, RetryAt, ThrottledUntil
    from platform_tasks.envelope import Envelope

logger = logging.getLogger(__name__)

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
    "platform_jobs_throttled", "Jobs rescheduled without spending an attempt.",
    (*_LABELS, "reason"),
)  # fmt: skip

UNKNOWN = "unknown"
POISON_REASONS = frozenset(
    {"poison", "unknown_task", "undecodable_body", "invalid_message", "missing_celery_headers"}
)
"""Dead-letter reasons that also count as poison (never a handler's failure)."""


class MetricsHook(PipelineHook):
    """Prometheus counters for every outcome, labelled only with declared names."""

    def __init__(self, app: Any) -> None:
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

    def on_duplicate(self, delivery: Delivery, envelope: Envelope[Any], verdict: Duplicate
                     ) -> None:  # fmt: skip
        DUPLICATE_SKIPPED.labels(**self.labels(delivery.queue, delivery.consumer)).inc()

    def on_retry_scheduled(self, delivery: Delivery, envelope: Envelope[Any], verdict: RetryAt
                           ) -> None:  # fmt: skip
        RETRIED.labels(**self.labels(delivery.queue, delivery.consumer)).inc()

    def on_throttled(self, delivery: Delivery, envelope: Envelope[Any],
                     verdict: ThrottledUntil) -> None:  # fmt: skip
        THROTTLED.labels(reason=verdict.reason,
                         **self.labels(delivery.queue, delivery.consumer)).inc()  # fmt: skip

    def on_dead_lettered(self, record: DeadLetterRecord, dead_letter_id: int,
                         error: BaseException | None) -> None:  # fmt: skip
        labels = self.labels(record.queue, record.kind)
        if record.reason in POISON_REASONS:
            POISON.labels(**labels).inc()
        DEAD_LETTERED.labels(reason=record.reason, **labels).inc()


def registry_for_exposition() -> CollectorRegistry | None:
    """The registry to serve: the multiprocess sum under prefork, else the default one."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


class MetricsServerStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker bootstep: serves ``/metrics`` on ``PLATFORM_METRICS_PORT`` when it is set."""

    label = "platform metrics"

    def start(self, worker: Any) -> None:
        port = worker.app.platform_settings.metrics_port
        if port is None:
            return
        registry = registry_for_exposition()
        if worker.app.platform_settings.fair_queues:
            from prometheus_client import REGISTRY

            from platform_tasks.transport.fair_metrics import FairQueueCollector

            (registry or REGISTRY).register(FairQueueCollector(worker.app))
        if registry is None:
            start_http_server(port)
        else:
            start_http_server(port, registry=registry)
        logger.info("serving metrics on port %s", port,
                    extra={"event": "metrics.serving", "port": port})  # fmt: skip


def _mark_process_dead(pid: int | None = None, **_: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())  # type: ignore[no-untyped-call]


def install(app: Any) -> None:
    """Serve metrics from every worker of ``app`` and tidy up after exiting pool processes."""
    app.steps["worker"].add(MetricsServerStep)
    signals.worker_process_shutdown.connect(
        _mark_process_dead, weak=False, dispatch_uid="platform_tasks.metrics.mark_dead"
    )
