"""Prometheus series of the per-key limits.

- ``platform_jobs_cap_refused_total{task}``: deliveries refused by their concurrency cap
  and put back to wait (no attempt spent); a job refused five times counts five.
- ``platform_jobs_waiting_on_cap{task}``: jobs of the task waiting on a cap right now,
  across all workers, as the worker that last took or refused a slot saw it (a sorted set
  in Redis; see :meth:`ConcurrencyLeases.acquire_and_track`). Multi-process workers show
  the highest value any pool process wrote last.

Throttle waits are counted by the consumer's ``platform_jobs_throttled_total`` with
``reason`` ``concurrency_cap``, ``throttle`` or ``throttle_total``. Labels are registered
task names only: bounded cardinality (never a key such as a tenant id).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

CAP_REFUSED = Counter(
    "platform_jobs_cap_refused",
    "Deliveries refused by their concurrency cap (put back to wait).",
    ("task",),
)
WAITING_ON_CAP = Gauge(
    "platform_jobs_waiting_on_cap",
    "Jobs waiting on a concurrency cap, across all workers.",
    ("task",),
    multiprocess_mode="mostrecent",
)


def record_cap(task: str, *, refused: bool, waiting: int) -> None:
    if refused:
        CAP_REFUSED.labels(task=task).inc()
    WAITING_ON_CAP.labels(task=task).set(waiting)
