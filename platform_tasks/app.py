"""The application factory: a Celery app with the platform's defaults and collaborators.

This is the composition root: the one module that lists every concern's installer. The
app's class lives in :mod:`platform_tasks.kernel` (re-exported here), so modules that only
need its type do not import this one.

Defaults are chosen for the guarantees in the contract: JSON only (no pickle crosses the
broker), late acks so a crash redelivers instead of losing, task events on for Flower,
and a broker sweep no slower than the visibility timeout so a killed worker's jobs come
back in about that long.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from platform_tasks.brokers.selection import refuse_cluster_broker, transport_conf
from platform_tasks.consumer.retry import DEFAULT_POLICY, RetryPolicy, resolve_policies
from platform_tasks.kernel import PlatformCelery
from platform_tasks.publishing.queue_port import QueuePort
from platform_tasks.settings import PlatformSettings

__all__ = [
    "BEAT_SCHEDULER",
    "PLATFORM_APP_NAME",
    "PlatformCelery",
    "create_app",
    "platform_defaults",
    "platform_queue_port",
]

BEAT_SCHEDULER = "platform_tasks.beat:LeaseScheduler"


def _installers() -> list[Callable[[PlatformCelery], None]]:
    """Each concern wires its bootsteps, signals and checks into a new app, in this order.

    Explicit installation (no import-time ``connect``) keeps importing the package free of
    side effects; each line belongs to the module that owns the concern.
    """
    from platform_tasks.batches.watchdog import install as install_batch_watchdog
    from platform_tasks.brokers.queue_latency import install as install_queue_latency
    from platform_tasks.brokers.selection import install as install_broker_checks
    from platform_tasks.brokers.transport.fair_metrics import install as install_fair_metrics
    from platform_tasks.brokers.worker_queues import install as install_worker_queues
    from platform_tasks.consumer.dropped_messages import install as install_consumer
    from platform_tasks.consumer.exporter_metrics import install as install_exporter
    from platform_tasks.consumer.hooks import install as install_pipeline_hooks
    from platform_tasks.consumer.queue_pause import install as install_queue_pause
    from platform_tasks.consumer.runnable import install as install_runnable_gauge
    from platform_tasks.consumer.span_hooks import install as install_span_hooks
    from platform_tasks.consumer.task import install as install_platform_task
    from platform_tasks.contrib.beat_leases import install as install_beat_leases
    from platform_tasks.dead_letters.alert_sender import install as install_alert_sender
    from platform_tasks.fanout import install_default as install_fanout
    from platform_tasks.jobs.worker import install as install_scheduled_jobs
    from platform_tasks.notifications.setup import install as install_notification_rails
    from platform_tasks.observability.event_batching import install as install_task_events
    from platform_tasks.observability.metrics import install as install_metrics
    from platform_tasks.publishing.delay_promoter import install as install_delay_promoter
    from platform_tasks.publishing.outbox_relay import install as install_outbox_relay

    return [
        install_delay_promoter,
        install_outbox_relay,
        install_scheduled_jobs,
        install_beat_leases,
        install_fanout,
        install_consumer,
        install_platform_task,
        install_pipeline_hooks,
        install_metrics,
        install_exporter,
        install_span_hooks,
        install_queue_latency,
        install_runnable_gauge,
        install_fair_metrics,
        install_worker_queues,
        install_broker_checks,
        install_task_events,
        install_notification_rails,
        install_queue_pause,
        install_alert_sender,
        install_batch_watchdog,
    ]


def platform_defaults(settings: PlatformSettings) -> dict[str, Any]:
    """Celery settings the platform relies on; a caller's keyword arguments override them."""
    visibility = settings.visibility_timeout_seconds
    return {
        "broker_url": settings.effective_broker_url,
        "accept_content": ["json"],
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_ignore_result": True,
        "task_default_queue": "default",
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            "visibility_timeout": visibility,
        },
        "beat_scheduler": BEAT_SCHEDULER,
        "enable_utc": True,
        "timezone": "UTC",
    }


def create_app(
    name: str,
    *,
    settings: PlatformSettings | None = None,
    retry_policies: dict[str, RetryPolicy] | None = None,
    **celery_conf: Any,
) -> PlatformCelery:
    """Build the Celery app with platform defaults; ``celery_conf`` are Celery settings.

    Settings come from the environment unless given; invalid settings or retry policies
    raise before the app exists, naming the variable or queue.
    """
    settings = settings if settings is not None else PlatformSettings.from_env()
    refuse_cluster_broker(settings)
    policies = resolve_policies(retry_policies)
    app = PlatformCelery(name, set_as_current=True)
    app.platform_settings = settings
    app.retry_policies = policies
    app.default_retry_policy = DEFAULT_POLICY
    conf = platform_defaults(settings)
    transport_options = dict(conf["broker_transport_options"])
    transport_options.update(celery_conf.pop("broker_transport_options", {}) or {})
    conf.update(celery_conf)
    conf["broker_transport_options"] = transport_options
    conf.update(transport_conf(settings, conf))
    app.conf.update(conf)
    for installer in _installers():
        installer(app)
    return app


PLATFORM_APP_NAME = "platform_tasks"


def platform_queue_port(settings: Any) -> QueuePort:
    """A queue port on an app built from platform settings alone, with no user task.

    For tools that publish on the application's behalf without importing it (replay from
    an ops box): the broker URL, the transport and the message format come from the
    settings and the platform's defaults, so the message is the one the application's own
    ``publish`` of the same envelope to the same queue would send (Celery protocol 2, task
    id = job id, ``argsrepr`` without ``data``, JSON). Routing is by queue name; an
    application with its own exchanges or broker transport options replays with its app.
    """
    return QueuePort(create_app(PLATFORM_APP_NAME, settings=settings))
