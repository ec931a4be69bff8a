"""Prometheus metrics of the transactional outbox, measured by every relay after a pass.

- ``platform_outbox_rows_waiting`` — committed ``core.outbox`` rows of this profile not
  yet handed to the broker (gauge)
- ``platform_outbox_lag_seconds`` — age of the oldest of them by the database clock, 0
  when none waits (gauge); it grows without bound only when no relay runs or every relay
  fails, which is what the ``PlatformOutboxRelayStalled`` alert (docs/alerts) watches
- ``platform_outbox_relayed_total`` — rows handed to the broker by this process

Measured only when ``PLATFORM_METRICS_PORT`` is set (one extra query per pass), so a
deployment without metrics pays nothing.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

__all__ = ["METRIC_NAMES", "OUTBOX_LAG", "OUTBOX_RELAYED", "OUTBOX_WAITING", "observe_outbox"]

OUTBOX_WAITING = Gauge(
    "platform_outbox_rows_waiting",
    "Committed outbox rows not yet handed to the broker.",
    multiprocess_mode="mostrecent",
)
OUTBOX_LAG = Gauge(
    "platform_outbox_lag_seconds",
    "Age of the oldest committed outbox row (0 when none waits).",
    multiprocess_mode="mostrecent",
)
OUTBOX_RELAYED = Counter("platform_outbox_relayed", "Outbox rows handed to the broker.")

METRIC_NAMES: tuple[str, ...] = (
    "platform_outbox_rows_waiting",
    "platform_outbox_lag_seconds",
    "platform_outbox_relayed_total",
)


def observe_outbox(waiting: int, oldest_age_seconds: float | None) -> None:
    """Set the gauges from one measurement (``None``: the outbox is empty)."""
    OUTBOX_WAITING.set(waiting)
    OUTBOX_LAG.set(max(0.0, oldest_age_seconds or 0.0))


def outbox_relayed(count: int) -> None:
    OUTBOX_RELAYED.inc(count)
