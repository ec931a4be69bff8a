"""Fan-out metrics (Prometheus), labelled by scheduled ``job`` and target ``kind``.

- ``platform_fanout_tenants_published_total`` — per-tenant envelopes put on the queue
  (a batch published again after a crash counts again)
- ``platform_fanout_runs_total`` — deliveries of fan-out jobs by ``outcome``
  (``finished``, ``already_finished``, ``failed``, ``queue_full``: handed back while the
  target queue stayed above ``PLATFORM_FANOUT_MAX_QUEUE_DEPTH``)
- ``platform_fanout_duration_seconds`` — wall time of one delivery of a fan-out job

They are served with the consumer metrics (``PLATFORM_METRICS_PORT``).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

__all__ = ["DURATION", "RUNS", "TENANTS_PUBLISHED"]

_LABELS = ("job", "kind")

TENANTS_PUBLISHED = Counter(
    "platform_fanout_tenants_published", "Per-tenant envelopes published by fan-outs.", _LABELS
)
RUNS = Counter(
    "platform_fanout_runs", "Deliveries of fan-out jobs by outcome.", (*_LABELS, "outcome")
)
DURATION = Histogram(
    "platform_fanout_duration_seconds",
    "Wall time of one delivery of a fan-out job.",
    _LABELS,
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
)
