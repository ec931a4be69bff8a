"""Prometheus metrics of beat and the delay store, where operators already look.

Beat (labelled ``replica``, the replica's owner id ``<host>:<pid>``, the same value as
``owner=`` in its log lines):

- ``platform_beat_points_admitted_total`` — points this replica admitted
- ``platform_beat_points_skipped_total`` — points it considered and skipped, by
  ``reason``: ``overlap``, ``duplicate``, ``late``, ``redis_error`` (a ``not_yet`` point
  stays pending and is not counted)
- ``platform_beat_admission_latency_seconds`` — histogram of how long after its point an
  admitted point was judged (Redis time)

Workers (one scrape target per worker):

- ``platform_job_lease_renewals_failed_total`` — renewals of a running job's lease that
  failed, by ``job`` and ``reason`` (``lost``, ``redis_error``); each one cancels the run

Delays (every process that runs a promoter: workers and beat):

- ``platform_delay_entries_waiting`` — entries in the delay store, due or not (gauge)
- ``platform_delay_promotion_lag_seconds`` — how overdue the oldest due entry was when
  the promoter last looked (gauge; about the poll interval when promotion keeps up)
- ``platform_delay_promoted_total`` — entries moved onto their queues

Beat and workers serve them on ``PLATFORM_METRICS_PORT`` (a port already taken is logged,
never fatal); the beat and delay gauges are measured only when that setting is set, so a
deployment without metrics pays nothing. Names are listed in :data:`METRIC_NAMES`, which
the example Grafana dashboard (``docs/grafana-scheduler.json``) is checked against.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from platform_tasks.observability.metrics_server import MetricsServer, serve

__all__ = [
    "ADMISSION_LATENCY",
    "DELAY_PROMOTED",
    "DELAY_PROMOTION_LAG",
    "DELAY_WAITING",
    "LEASE_RENEWALS_FAILED",
    "METRIC_NAMES",
    "POINTS_ADMITTED",
    "POINTS_SKIPPED",
    "BeatMetrics",
    "MetricsServer",
    "lease_renewal_failed",
    "serve",
]


POINTS_ADMITTED = Counter(
    "platform_beat_points_admitted", "Scheduled points this beat replica admitted.", ("replica",)
)
POINTS_SKIPPED = Counter(
    "platform_beat_points_skipped",
    "Scheduled points this beat replica considered and skipped, by reason.",
    ("replica", "reason"),
)
ADMISSION_LATENCY = Histogram(
    "platform_beat_admission_latency_seconds",
    "Seconds from a point to the Redis time its admission was judged (admitted points).",
    ("replica",),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
LEASE_RENEWALS_FAILED = Counter(
    "platform_job_lease_renewals_failed",
    "Failed renewals of a running job's lease (each cancels the run).",
    ("job", "reason"),
)
DELAY_WAITING = Gauge(
    "platform_delay_entries_waiting",
    "Entries waiting in the delay store, due or not.",
    multiprocess_mode="mostrecent",
)
DELAY_PROMOTION_LAG = Gauge(
    "platform_delay_promotion_lag_seconds",
    "How overdue the oldest due delay entry was when the promoter last looked.",
    multiprocess_mode="mostrecent",
)
DELAY_PROMOTED = Counter("platform_delay_promoted", "Delay entries moved onto their queues.")

METRIC_NAMES: tuple[str, ...] = (
    "platform_beat_points_admitted_total",
    "platform_beat_points_skipped_total",
    "platform_beat_admission_latency_seconds",
    "platform_job_lease_renewals_failed_total",
    "platform_delay_entries_waiting",
    "platform_delay_promotion_lag_seconds",
    "platform_delay_promoted_total",
)
"""The exported names as queried (counters with ``_total``; the histogram's series are
``<name>_bucket``, ``_sum`` and ``_count``)."""

_SKIP_REASONS = {
    "skipped_overlap": "overlap",
    "skipped_duplicate": "duplicate",
    "skipped_late": "late",
    "skipped_redis_error": "redis_error",
}


class BeatMetrics:
    """Counts one beat replica's point outcomes; ``observe`` is the engine's ``on_result``.

    Label children are resolved once, so a tick of thousands of points costs one
    increment per point.
    """

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self._admitted = POINTS_ADMITTED.labels(replica=replica)
        self._latency = ADMISSION_LATENCY.labels(replica=replica)
        self._skipped = {
            outcome: POINTS_SKIPPED.labels(replica=replica, reason=reason)
            for outcome, reason in _SKIP_REASONS.items()
        }

    def observe(self, result: Any) -> None:
        """Count one considered point (a :class:`~platform_tasks.jobs.trigger.PointResult`)."""
        outcome = result.outcome.value
        if outcome == "admitted":
            self._admitted.inc()
            if result.judged_at_ms is not None:
                self._latency.observe(max(0, result.judged_at_ms - result.point_ms) / 1000)
            return
        skipped = self._skipped.get(outcome)
        if skipped is not None:
            skipped.inc()


def lease_renewal_failed(job: str, reason: str) -> None:
    """Count a failed renewal of ``job``'s running lease (``lost`` or ``redis_error``)."""
    LEASE_RENEWALS_FAILED.labels(job=job, reason=reason).inc()


def observe_delay_store(waiting: int, oldest_due_ms: int | None, now_ms: int) -> None:
    """Set the delay gauges from one look at the store (judged by Redis time)."""
    DELAY_WAITING.set(waiting)
    overdue = 0 if oldest_due_ms is None else max(0, now_ms - oldest_due_ms)
    DELAY_PROMOTION_LAG.set(overdue / 1000)


def delay_promoted(count: int) -> None:
    DELAY_PROMOTED.inc(count)
