"""Which kombu transport a platform app uses, and the sweep timing it gets.

``create_app`` asks this module for the Celery settings of the broker transport: the
platform transport for ``redis://`` and ``rediss://`` brokers, kombu's own when the
operator sets ``PLATFORM_TRANSPORT=stock``, kombu's py-amqp transport with quorum-queue
defaults for RabbitMQ (``platform_tasks.brokers.selection``), and a start-up error for
Redis setups the platform transport does not support (Sentinel) instead of a worker that misbehaves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from platform_tasks.brokers.selection import (
    amqp_conf,
    amqp_transport_options,
    broker_kind,
    broker_scheme,
)
from platform_tasks.errors import ConfigurationError
from platform_tasks.settings import PlatformSettings

TRANSPORT_PATH = "platform_tasks.transport:Transport"
"""Import path of the platform transport, as Celery's ``broker_transport`` takes it."""

SUPPORTED_SCHEMES = frozenset({"redis", "rediss"})
REFUSED_SCHEMES = frozenset({"sentinel", "sentinels"})

MAX_SWEEP_INTERVAL = 10.0
MIN_SWEEP_INTERVAL = 1.0


def sweep_interval(visibility_timeout: float, configured: float | None = None) -> float:
    """Seconds between sweeps for unacked messages older than the visibility timeout.

    Never longer than the visibility timeout, so a killed worker's messages come back
    within about one visibility timeout plus one interval (stock kombu sweeps every
    ``10 s x 10`` calls by default, far longer than a short timeout). A quarter of the
    timeout, between 1 and 10 seconds: one cheap read-only script per interval.
    """
    if configured is not None and configured > 0:
        return float(min(configured, visibility_timeout))
    quarter = visibility_timeout / 4
    return float(min(visibility_timeout, max(MIN_SWEEP_INTERVAL, min(MAX_SWEEP_INTERVAL, quarter))))


MAX_IN_FLIGHT_INTERVAL = 30.0


def in_flight_interval(visibility_timeout: float) -> float:
    """Seconds between refreshes of the unacked records of messages a worker holds.

    A quarter of the visibility timeout (at most 30 s), so three refreshes can be late
    or refused before a live worker's message looks expired to a sweeper.
    """
    return float(min(MAX_IN_FLIGHT_INTERVAL, visibility_timeout / 4))


def transport_conf(settings: PlatformSettings, conf: Mapping[str, Any]) -> dict[str, Any]:
    """Celery settings for the broker transport, given the app's merged settings.

    An explicit ``broker_transport`` in ``conf`` wins. Transport options the caller set
    are kept; only missing sweep options are filled in.
    """
    url = str(conf.get("broker_url") or settings.effective_broker_url)
    options = dict(conf.get("broker_transport_options") or {})
    if broker_kind(url) == "amqp":
        amqp = {key: value for key, value in amqp_conf(settings).items() if key not in conf}
        amqp["broker_transport_options"] = amqp_transport_options(options)
        return amqp
    visibility = float(options.get("visibility_timeout", settings.visibility_timeout_seconds))
    options.setdefault("unacked_restore_interval", sweep_interval(visibility))
    # Stock kombu only scans on every Nth timer call; 1 makes the interval the period.
    options.setdefault("unacked_restore_throttle", 1)
    if settings.fair_queues:
        options.setdefault("fair_queues", list(settings.fair_queues))
    if settings.tenant_weights:
        options.setdefault("tenant_weights", dict(settings.tenant_weights))
    updates: dict[str, Any] = {"broker_transport_options": options}
    if conf.get("broker_transport") or settings.transport == "stock":
        return updates
    scheme = broker_scheme(url)
    if scheme in REFUSED_SCHEMES:
        raise ConfigurationError(
            f"the platform transport does not support Redis Sentinel brokers ({scheme}://): "
            "set PLATFORM_TRANSPORT=stock to use kombu's Sentinel transport, which can lose "
            "a message when a worker is killed"
        )
    if scheme in SUPPORTED_SCHEMES:
        updates["broker_transport"] = TRANSPORT_PATH
    return updates
