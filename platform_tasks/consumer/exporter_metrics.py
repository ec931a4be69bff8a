"""The task and worker series of celery-exporter, counted inside the worker.

Dashboards and alerts built on `celery-exporter <https://github.com/danihodovic/celery-exporter>`_
query these names and labels (taken from its ``src/exporter.py``):

- ``celery_task_sent_total``, ``celery_task_received_total``,
  ``celery_task_started_total``, ``celery_task_succeeded_total``,
  ``celery_task_retried_total`` — labels ``name``, ``hostname``, ``queue_name``
- ``celery_task_failed_total`` — labels ``name``, ``hostname``, ``exception``, ``queue_name``
- ``celery_task_runtime`` — histogram (``_bucket``/``_sum``/``_count``) of successful
  runs' seconds, labels ``name``, ``hostname``, ``queue_name``
- ``celery_worker_up`` — gauge, label ``hostname``
- ``celery_worker_tasks_active`` — gauge, label ``hostname``
- ``celery_queue_length`` — gauge, label ``queue_name`` (measured when scraped, see
  :mod:`~platform_tasks.brokers.queue_latency`)

celery-exporter builds them from the event stream; here each process counts its own from
Celery's signals and the worker's ``/metrics`` sums the pool processes (prometheus-client
multiprocess mode, as for the platform's own counters). So the series are the same, with
no separate exporter to run. Differences, on purpose: a throttled job (rescheduled
without spending an attempt) is not counted as ``retried``; a dead-lettered job counts as
``failed`` with the ``exception`` of the handler's error (the type name of the error that
made it a dead letter, as celery-exporter shows the class name of a task's exception);
``sent`` counts what this process published (a worker's retries and fan-out children,
a beat's runs); a web process that wants ``sent`` serves its own registry.

Cardinality stays bounded like the platform's counters: ``name`` is a registered task or
``unknown``, ``queue_name`` a queue the app declares or ``unknown``, ``hostname`` the
host part of the node name (as celery-exporter's ``get_hostname``), ``exception`` an
exception class name. No job id, no tenant.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from celery import current_app, signals
from celery.utils.nodenames import nodesplit
from prometheus_client import Counter, Gauge, Histogram

from platform_tasks.consumer.delivery import consumed_queue
from platform_tasks.consumer.hooks import MetricsHook, PipelineHook, add_hook

if TYPE_CHECKING:
    from celery import Celery

    from platform_tasks.consumer.delivery import Delivery
    from platform_tasks.consumer.verdicts import ThrottledUntil
    from platform_tasks.dead_letters.dead_letter import DeadLetter
    from platform_tasks.envelope import Envelope
    from platform_tasks.kernel import PlatformCelery

__all__ = ["METRIC_NAMES", "install"]

_TASK_LABELS = ("name", "hostname", "queue_name")
UNKNOWN = "unknown"

SENT = Counter("celery_task_sent", "Sent when a task message is published.", _TASK_LABELS)
RECEIVED = Counter("celery_task_received", "Sent when the worker receives a task.", _TASK_LABELS)
STARTED = Counter(
    "celery_task_started", "Sent just before the worker executes the task.", _TASK_LABELS
)
SUCCEEDED = Counter(
    "celery_task_succeeded", "Sent if the task executed successfully.", _TASK_LABELS
)
FAILED = Counter(
    "celery_task_failed",
    "Sent if the execution of the task failed.",
    ("name", "hostname", "exception", "queue_name"),
)
RETRIED = Counter(
    "celery_task_retried",
    "Sent if the task failed, but will be retried in the future.",
    _TASK_LABELS,
)
RUNTIME = Histogram("celery_task_runtime", "Histogram of task runtime measurements.", _TASK_LABELS)
WORKER_UP = Gauge(
    "celery_worker_up",
    "Indicates if a worker has recently sent a heartbeat.",
    ("hostname",),
    multiprocess_mode="livemax",
)
TASKS_ACTIVE = Gauge(
    "celery_worker_tasks_active",
    "The number of tasks the worker is currently processing",
    ("hostname",),
    multiprocess_mode="livesum",
)

METRIC_NAMES: tuple[str, ...] = (
    "celery_task_sent_total",
    "celery_task_received_total",
    "celery_task_started_total",
    "celery_task_succeeded_total",
    "celery_task_failed_total",
    "celery_task_retried_total",
    "celery_task_runtime",
    "celery_worker_up",
    "celery_worker_tasks_active",
    "celery_queue_length",
)
"""The celery-exporter names as queried (the histogram's series add ``_bucket`` etc.)."""

_local = threading.local()
"""Per thread: the running task's :class:`_Run` (its label children, its start, a throttle
or dead letter the pipeline just settled, read by the signal Celery sends next)."""

_seen: set[tuple[str, str, str]] = set()
"""Label sets whose worker-side counters exist (at zero) already."""


_host: list[str] = []


def hostname_label(node: str | None) -> str:
    """The host part of a node name (``w1@host`` → ``host``), as celery-exporter labels it;
    this machine's name when there is no node (a publisher)."""
    if not node:
        if not _host:
            _host.append(socket.gethostname())
        return _host[0]
    return str(nodesplit(node)[1] or node)


_LABELS_TTL_SECONDS = 60.0
_LABEL_CACHE_SIZE = 4096
_label_cache: dict[tuple[Any, ...], tuple[tuple[str, str, str], float]] = {}
"""Labels by what they are judged from, each kept for :data:`_LABELS_TTL_SECONDS`: judging
walks the app's tasks and queues, too slow for every event, and a name declared later
(``unknown`` until then) is labelled by its name within that time. Cleared when it
reaches :data:`_LABEL_CACHE_SIZE` entries (names a producer made up)."""

_children: dict[tuple[Any, ...], Any] = {}
"""Metric children by (metric, labels): bounded like the labels themselves."""


def _child(metric: Any, *labels: str) -> Any:
    key = (id(metric), *labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


def _cached(key: tuple[Any, ...], judge: Any) -> tuple[str, str, str]:
    now = time.monotonic()
    found = _label_cache.get(key)
    if found is not None and found[1] > now:
        return found[0]
    labels: tuple[str, str, str] = judge()
    if len(_label_cache) >= _LABEL_CACHE_SIZE:
        _label_cache.clear()
    _label_cache[key] = (labels, now + _LABELS_TTL_SECONDS)
    return labels


def _labels(
    app: Celery, name: str | None, queue: str | None, node: str | None
) -> tuple[str, str, str]:
    bounded = MetricsHook(app)
    return bounded.task_label(name), hostname_label(node), bounded.queue_label(queue)


def _queue_of(task: Any, info: Any) -> str | None:
    try:
        return consumed_queue(task, info)
    except Exception:  # a task without an app's queues: the routing key, if any
        routing_key = info.get("routing_key")
        return routing_key if isinstance(routing_key, str) else None


def _worker_labels(task: Any, request: Any) -> tuple[str, str, str]:
    info = getattr(request, "delivery_info", None) or {}
    node = getattr(request, "hostname", None)
    name = getattr(task, "name", None)
    app = getattr(task, "app", None) or current_app._get_current_object()
    key = (id(app), name, info.get("routing_key"), info.get("exchange"), node)
    labels = _cached(key, lambda: _labels(app, name, _queue_of(task, info), node))
    if labels not in _seen:  # like celery-exporter: every worker-side series from zero
        _seen.add(labels)
        name_label, host, queue = labels
        for counter in (RECEIVED, STARTED, SUCCEEDED, RETRIED):
            _child(counter, name_label, host, queue).inc(0)
        _child(FAILED, name_label, host, "", queue).inc(0)
    return labels


def _on_sent(sender: Any = None, headers: Any = None, routing_key: Any = None, **_: Any) -> None:
    name = sender if isinstance(sender, str) else getattr(sender, "name", None)
    if name is None and isinstance(headers, dict):
        name = headers.get("task")
    queue = routing_key if isinstance(routing_key, str) else None
    app = current_app._get_current_object()
    if not app.finalized:  # reading its tasks would finalize an app mid-publish
        _child(SENT, UNKNOWN, hostname_label(None), UNKNOWN).inc()
        return
    labels = _cached((id(app), name, queue, None), lambda: _labels(app, name, queue, None))
    _child(SENT, *labels).inc()


def _on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    task = getattr(request, "task", None)
    if task is None:
        return
    _child(RECEIVED, *_worker_labels(task, request)).inc()


class _Run:
    """What the signals of one run share, worked out once at its start."""

    __slots__ = (
        "active",
        "error_type",
        "labels",
        "retried",
        "runtime",
        "started",
        "succeeded",
        "task_id",
        "throttled",
    )

    def __init__(self, task_id: Any, labels: tuple[str, str, str]) -> None:
        self.task_id = task_id
        self.succeeded = _child(SUCCEEDED, *labels)
        self.retried = _child(RETRIED, *labels)
        self.runtime = _child(RUNTIME, *labels)
        self.active = _child(TASKS_ACTIVE, labels[1])
        self.labels = labels
        self.started = time.monotonic()
        self.throttled = False
        self.error_type: str | None = None


def _run(task: Any, request: Any) -> _Run:
    """This thread's run of ``task`` (its start's, or worked out now if it had none)."""
    run: _Run | None = getattr(_local, "run", None)
    task_id = getattr(request, "id", None)
    if run is None or run.task_id != task_id:
        run = _local.run = _Run(task_id, _worker_labels(task, request))
    return run


def _on_prerun(sender: Any = None, task: Any = None, **_: Any) -> None:
    task = task or sender
    if task is None:
        return
    labels = _worker_labels(task, task.request)
    _child(STARTED, *labels).inc()
    run = _local.run = _Run(getattr(task.request, "id", None), labels)
    run.active.inc()


def _on_postrun(sender: Any = None, task: Any = None, **_: Any) -> None:
    run: _Run | None = getattr(_local, "run", None)
    if run is not None:
        run.active.dec()
        _local.run = None


def _on_success(sender: Any = None, **_: Any) -> None:
    if sender is None:
        return
    run = _run(sender, sender.request)
    run.succeeded.inc()
    run.runtime.observe(time.monotonic() - run.started)


def _on_failure(sender: Any = None, exception: BaseException | None = None, **_: Any) -> None:
    if sender is None:
        return
    run = _run(sender, sender.request)
    name, host, queue = run.labels
    exception_label = run.error_type or (type(exception).__name__ if exception else "")
    _child(FAILED, name, host, exception_label, queue).inc()


def _on_retry(sender: Any = None, request: Any = None, **_: Any) -> None:
    if sender is None:
        return
    run = _run(sender, request or sender.request)
    if not run.throttled:
        run.retried.inc()


def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    WORKER_UP.labels(hostname_label(getattr(sender, "hostname", None))).set(1)


def _on_worker_shutdown(sender: Any = None, **_: Any) -> None:
    WORKER_UP.labels(hostname_label(getattr(sender, "hostname", None))).set(0)


class ExporterHook(PipelineHook):
    """Tells the signal handlers what Celery cannot: a throttle, a dead letter's error."""

    def on_throttled(
        self, delivery: Delivery, envelope: Envelope[Any], verdict: ThrottledUntil
    ) -> None:
        run: _Run | None = getattr(_local, "run", None)
        if run is not None:
            run.throttled = True

    def on_dead_lettered(
        self, record: DeadLetter, dead_letter_id: int, error: BaseException | None
    ) -> None:
        run: _Run | None = getattr(_local, "run", None)
        if run is None:
            return
        if error is not None:
            run.error_type = type(error).__name__
        elif record.error_type:
            run.error_type = record.error_type.rsplit(".", 1)[-1]


_SIGNALS = (
    (signals.after_task_publish, _on_sent),
    (signals.task_received, _on_received),
    (signals.task_prerun, _on_prerun),
    (signals.task_postrun, _on_postrun),
    (signals.task_success, _on_success),
    (signals.task_failure, _on_failure),
    (signals.task_retry, _on_retry),
    (signals.worker_ready, _on_worker_ready),
    (signals.worker_shutdown, _on_worker_shutdown),
)


def install(app: PlatformCelery) -> None:
    """Count celery-exporter's series in every process of ``app`` (signals connect once)."""
    add_hook(app, ExporterHook())
    for signal, handler in _SIGNALS:
        uid = f"platform_tasks.celery_exporter.{handler.__name__}"
        signal.connect(handler, weak=False, dispatch_uid=uid)
