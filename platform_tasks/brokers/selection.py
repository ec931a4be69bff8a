"""Which broker a platform app talks to, which kombu transport it uses, and what each needs.

Two kinds of broker keep every guarantee of the contract:

- **Redis** (``redis://``, ``rediss://``, ``unix://``): the platform transport, and delays
  held in the delay store on the broker's own Redis, promoted atomically onto the queue.
- **RabbitMQ** (``amqp://``, ``amqps://``, ``pyamqp://``): quorum queues behind topic
  exchanges, publisher confirms, and delays held by RabbitMQ itself through Celery's
  native delayed delivery (a chain of quorum queues with at-least-once dead lettering),
  so a delayed job is a message in a replicated queue from the moment ``schedule``
  returns. With ``PLATFORM_RABBITMQ_DELAYS=delay_store`` delays wait in the Redis delay
  store instead and are published with confirms when due (at least once); the default
  and why it is the default, with the measurements, are in ``docs/brokers.md``.

Anything else (SQS, the in-memory transport, …) cannot hold delays durably;
:func:`broker_holds_delays` says so, and a worker on such a broker refuses to start.
A Redis Cluster is never a broker: kombu has no cluster transport.

``create_app`` asks this module for the Celery settings of the broker transport
(:func:`transport_conf`): the platform transport for ``redis://`` and ``rediss://``
brokers, kombu's own when the operator sets ``PLATFORM_TRANSPORT=stock``, kombu's py-amqp
transport with quorum-queue defaults for RabbitMQ, and a start-up error for Redis setups
the platform transport does not support (Sentinel) instead of a worker that misbehaves.
The sweep timing the platform transport gets (:func:`sweep_interval`,
:func:`in_flight_interval`) is decided here too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlparse

from celery import bootsteps

from platform_tasks.errors import ConfigurationError
from platform_tasks.settings import PlatformSettings, redact_url

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

BrokerKind = Literal["redis", "amqp", "other"]

REDIS_SCHEMES = frozenset({"redis", "rediss", "unix"})
AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp"})

CONSUMER_TIMEOUT_MARGIN_SECONDS = 60
"""How far below RabbitMQ's ``consumer_timeout`` the platform's default hard time limit sits.

The margin covers the time a delivery waits in the worker before its task starts
(prefetched behind a running job) plus the acknowledgement's trip back.
"""


def broker_scheme(url: str) -> str:
    """The scheme of the first broker URL, without a ``transport+`` prefix."""
    first = url.split(";", 1)[0].strip()
    scheme = urlparse(first).scheme.lower()
    return scheme.rsplit("+", 1)[-1] if "+" in scheme else scheme


def broker_kind(url: str) -> BrokerKind:
    """``redis``, ``amqp`` or ``other`` for a broker URL."""
    scheme = broker_scheme(url)
    if scheme in REDIS_SCHEMES:
        return "redis"
    if scheme in AMQP_SCHEMES:
        return "amqp"
    return "other"


def broker_holds_delays(settings: PlatformSettings) -> bool:
    """True when the broker keeps a delayed job durably until it is due.

    Redis brokers hold delays in the platform's delay store on the broker's Redis;
    RabbitMQ holds them in its native delayed-delivery quorum queues. A worker whose
    broker cannot hold delays must refuse to start, naming ``PLATFORM_BROKER_URL``:
    retries and ``schedule`` would otherwise lose jobs.
    """
    return broker_kind(settings.effective_broker_url) in ("redis", "amqp")


def delays_in_store(settings: PlatformSettings) -> Literal["redis", "rabbitmq"] | None:
    """Which delay store holds this deployment's delays, or ``None`` for RabbitMQ's native
    delayed delivery (and for brokers that hold no delays).

    ``redis``: the store on the broker's Redis, promoted atomically onto its lists.
    ``rabbitmq``: the store on the platform's Redis (``PLATFORM_REDIS_URL``), promoted into
    RabbitMQ with publisher confirms (``PLATFORM_RABBITMQ_DELAYS=delay_store``).
    """
    kind = broker_kind(settings.effective_broker_url)
    if kind == "redis":
        return "redis"
    if kind == "amqp" and settings.rabbitmq_delay_mode == "delay_store":
        return "rabbitmq"
    return None


def refuse_cluster_broker(settings: PlatformSettings) -> None:
    """Refuse a Redis Cluster as the broker, which no kombu transport can drive."""
    if settings.redis_cluster and settings.broker_url is None:
        raise ConfigurationError(
            "PLATFORM_REDIS_CLUSTER=true: the broker cannot be a Redis Cluster (kombu has no "
            "Redis Cluster transport); set PLATFORM_BROKER_URL to a RabbitMQ (amqp://) or a "
            f"single Redis URL; PLATFORM_REDIS_URL is {redact_url(settings.redis_url)}"
        )


def cluster_node_problem(settings: PlatformSettings) -> str | None:
    """Why the Redis broker cannot be used, when it is a node of a Redis Cluster.

    A plain ``redis://`` URL may point at a cluster node: kombu's Redis transport then
    starts, and the delay promoter and pidbox fail on every multi-key command (MOVED,
    CROSSSLOT). The server says it is a cluster node in ``INFO cluster``
    (``cluster_enabled:1``). An unreachable broker is not judged here: the worker's
    connection retries report it.
    """
    url = settings.effective_broker_url
    if broker_kind(url) != "redis":
        return None
    import redis

    try:
        client = redis.Redis.from_url(url.split(";")[0], socket_timeout=3, socket_connect_timeout=3)
    except ValueError:
        return None
    try:
        info = client.info("cluster")
    except redis.RedisError:
        return None
    finally:
        client.close()
    if str(info.get("cluster_enabled", 0)) != "1":
        return None
    return (
        f"PLATFORM_BROKER_URL ({redact_url(url)}) is a node of a Redis Cluster (INFO "
        "cluster: cluster_enabled:1), which cannot be the broker: kombu has no Redis "
        "Cluster transport and every multi-key command fails (MOVED/CROSSSLOT). Use a "
        "standalone Redis (redis://) or RabbitMQ (amqp://) as the broker; the platform's "
        "own Redis may be the cluster with PLATFORM_REDIS_URL and PLATFORM_REDIS_CLUSTER=true"
    )


def refuse_cluster_node_broker(settings: PlatformSettings) -> None:
    """Raise :class:`ConfigurationError` when the broker is a Redis Cluster node."""
    problem = cluster_node_problem(settings)
    if problem is not None:
        raise ConfigurationError(problem)


def default_time_limit_seconds(settings: PlatformSettings) -> int:
    """The hard time limit the platform gives tasks on RabbitMQ when none is configured.

    It protects late-acknowledged deliveries from ``consumer_timeout``; a task acknowledged
    on receipt needs none (``platform.jobs.run`` takes
    :data:`platform_tasks.jobs.worker.RUN_TIME_LIMIT_SECONDS` instead)."""
    timeout = settings.rabbitmq_consumer_timeout_seconds
    return max(1, timeout - min(CONSUMER_TIMEOUT_MARGIN_SECONDS, timeout // 2))


def amqp_conf(settings: PlatformSettings) -> dict[str, Any]:
    """Celery settings for a RabbitMQ broker.

    Every queue Celery declares for the platform is a quorum queue behind a topic
    exchange (native delayed delivery cannot route through direct exchanges), publishes
    wait for RabbitMQ's confirm, and each task has a hard time limit below
    ``consumer_timeout`` so a long job is stopped by Celery rather than by RabbitMQ
    closing the channel and redelivering it forever. A job stopped by its time limit is
    requeued (not acknowledged), and its redelivery settles the stopped attempt: retried
    with the queue's policy, dead-lettered after the last attempt
    (``consumer/time_limits.py``).
    """
    return {
        "task_default_queue_type": "quorum",
        "task_default_exchange_type": "topic",
        "task_create_missing_queue_type": "quorum",
        "task_create_missing_queue_exchange_type": "topic",
        "worker_detect_quorum_queues": True,
        "broker_native_delayed_delivery_queue_type": "quorum",
        "task_time_limit": default_time_limit_seconds(settings),
        # Plain tasks too: a task stopped by its time limit goes back to the queue rather
        # than being acknowledged (a PlatformTask's redelivery settles it as a failed attempt).
        "task_acks_on_timeout": False,
    }


def amqp_transport_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Transport options for RabbitMQ: publisher confirms on, Redis-only sweeps left out."""
    kept = {
        key: value
        for key, value in options.items()
        if key not in ("visibility_timeout", "unacked_restore_interval", "unacked_restore_throttle")
    }
    kept.setdefault("confirm_publish", True)
    return kept


def delay_countdown_seconds(seconds: float) -> int:
    """Whole seconds for RabbitMQ's delayed delivery, rounded up so a job is never early."""
    return max(1, math.ceil(seconds))


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


def time_limit_problems(app: PlatformCelery, prefetch_multiplier: int | None = None) -> list[str]:
    """Tasks whose delivery can stay unacknowledged as long as RabbitMQ's ``consumer_timeout``.

    RabbitMQ closes the channel of a delivery left unacknowledged longer than
    ``consumer_timeout`` and requeues the message, so a task running longer would loop
    forever (late acks). The platform cannot read the broker's setting through AMQP;
    the operator states it in ``PLATFORM_RABBITMQ_CONSUMER_TIMEOUT_SECONDS``.

    The clock starts at delivery, not when the task starts. With a prefetch multiplier of
    one (the platform's default) a worker takes a message only for an idle process; with
    ``m`` it holds ``m`` per process, so a message can wait behind ``m - 1`` jobs of its
    process first, each up to the longest time limit. ``prefetch_multiplier`` is the
    worker's (``--prefetch-multiplier``), default the app's setting; ``0`` (no limit)
    lets a message wait behind any number of jobs and is refused outright.
    """
    settings: PlatformSettings = app.platform_settings
    if broker_kind(settings.effective_broker_url) != "amqp":
        return []
    timeout = settings.rabbitmq_consumer_timeout_seconds
    default = app.conf.task_time_limit
    multiplier = int(
        app.conf.worker_prefetch_multiplier if prefetch_multiplier is None else prefetch_multiplier
    )
    problems = []
    if multiplier < 1:
        problems.append(
            f"worker_prefetch_multiplier={multiplier} (no limit) lets a message wait "
            "unacknowledged behind any number of jobs"
        )
    # A task acknowledged on receipt (``acks_late=False``, e.g. ``platform.jobs.run``)
    # holds no unacknowledged delivery while it runs: consumer_timeout does not concern it.
    names = sorted(
        name
        for name, task in app.tasks.items()
        if not name.startswith("celery.") and getattr(task, "acks_late", True) is not False
    )
    limits = {name: getattr(app.tasks[name], "time_limit", None) or default for name in names}
    longest = max((float(limit) for limit in limits.values() if limit), default=0.0)
    ahead = max(0, multiplier - 1) * longest
    for name, limit in limits.items():
        if not limit:
            problems.append(f"{name} has no time limit")
        elif float(limit) >= timeout:
            problems.append(f"{name} has time_limit={limit:g}s")
        elif multiplier > 1 and ahead + float(limit) >= timeout:
            problems.append(
                f"{name} can stay unacknowledged {ahead + float(limit):g}s (time_limit="
                f"{limit:g}s, after waiting behind {multiplier - 1} prefetched job(s) of up "
                f"to {longest:g}s each: worker_prefetch_multiplier={multiplier})"
            )
    return [
        f"{problem}, which must be below the broker's consumer_timeout of {timeout}s "
        "(PLATFORM_RABBITMQ_CONSUMER_TIMEOUT_SECONDS)"
        for problem in problems
    ]


def check_time_limits(app: PlatformCelery, prefetch_multiplier: int | None = None) -> None:
    """Raise :class:`ConfigurationError` listing every task whose limit RabbitMQ would cut."""
    problems = time_limit_problems(app, prefetch_multiplier)
    if problems:
        raise ConfigurationError(
            "a task could outlive RabbitMQ's consumer_timeout and be redelivered forever: "
            + "; ".join(problems)
            + ". Lower the task's time_limit or the worker's prefetch multiplier "
            "(worker_prefetch_multiplier, --prefetch-multiplier; the platform's default is "
            "1), or raise consumer_timeout on the broker and "
            "PLATFORM_RABBITMQ_CONSUMER_TIMEOUT_SECONDS with it"
        )


class TimeLimitCheckStep(bootsteps.Step):
    """Worker bootstep: a worker whose tasks RabbitMQ would cut off never starts."""

    label = "platform broker time limits"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        check_time_limits(worker.app, getattr(worker, "prefetch_multiplier", None))


class ClusterBrokerCheckStep(bootsteps.Step):
    """Worker bootstep: a worker whose Redis broker is a cluster node never starts."""

    label = "platform broker is no cluster node"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        refuse_cluster_node_broker(worker.app.platform_settings)


def install(app: PlatformCelery) -> None:
    """When a worker starts: refuse a Redis Cluster node as the broker, and check task
    time limits against RabbitMQ's ``consumer_timeout``."""
    app.steps["worker"].add(ClusterBrokerCheckStep)
    app.steps["worker"].add(TimeLimitCheckStep)
