"""``PlatformTask``: the Celery task base class that gives a handler the consumer guarantees.

A team writes::

    @app.task(base=PlatformTask, data_model=ChargeInvoice)
    def charge_invoice(envelope, tx): ...

and the task validates the envelope, claims the idempotency row in the transaction ``tx``
belongs to, retries with jittered backoff through the durable delay store, ends crash
loops and dead-letters what cannot succeed. The class itself stays thin: everything
happens in :class:`~platform_tasks.consumer.pipeline.DeliveryPipeline`.

Celery's own task options (``queue``, ``routing_key``, ``exchange``, ``priority``,
``time_limit``, ``soft_time_limit``, ``rate_limit``, ``ignore_result``, ``acks_late``,
``expires``...) keep Celery's meaning; retries go back to the queue the job was consumed
from. An attempt the pool kills at the hard ``time_limit`` is a failed attempt like one
that raised (retried, then dead-lettered), not an acknowledged message.

Task options a PlatformTask owns (``platform_options``; a subclass such as
``NotificationTask`` adds its own by extending that set):

``data_model``
    the pydantic model (or ``dict``) of ``envelope.data``; default ``dict``.
``permanent_errors``
    a tuple of exception types that, like :class:`~platform_tasks.errors.PermanentError`,
    are dead-lettered at once instead of retried.

An unknown option is an error at declaration, as are Celery's own retry options
(``autoretry_for`` and friends, ``max_retries``, ``default_retry_delay``): they would
retry through worker-held ETAs and past ``max_attempts``, which is exactly what the
platform replaces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import celery
from celery import bootsteps
from pydantic import BaseModel

from platform_tasks.brokers.selection import broker_holds_delays, broker_scheme
from platform_tasks.brokers.worker_queues import add_queue_source
from platform_tasks.consumer.unsettled import VERDICT_RAISES, requeue_unsettled, settled
from platform_tasks.errors import ConfigurationError, DeadLettered
from platform_tasks.limits.options import LIMIT_OPTIONS, LimitSpec, limit_spec
from platform_tasks.postgres.database import require_database_url

if TYPE_CHECKING:
    from platform_tasks.kernel import PlatformCelery

PLATFORM_OPTIONS = frozenset({"data_model", "permanent_errors"}) | LIMIT_OPTIONS
"""The task options PlatformTask owns (its per-key limits: :mod:`platform_tasks.limits`)."""

CELERY_RETRY_OPTIONS = frozenset(
    {
        "autoretry_for",
        "dont_autoretry_for",
        "retry_backoff",
        "retry_backoff_max",
        "retry_jitter",
        "retry_kwargs",
        "max_retries",
        "default_retry_delay",
    }
)
"""Celery retry options refused on a PlatformTask; use ``retry_policies`` instead."""

CELERY_ROUTING_OPTIONS = frozenset(
    {
        "queue",
        "routing_key",
        "exchange",
        "exchange_type",
        "delivery_mode",
        "compression",
        "shadow",
        "store_eager_result",
        "immediate",
        "mandatory",
    }
)
"""Celery task options read through ``getattr`` (``apply_async`` defaults, routing), not
attributes of ``celery.Task`` itself; every other Celery option is a ``celery.Task`` attribute."""

_DECORATOR_KEYS = frozenset(
    {
        "app",
        "name",
        "run",
        "_decorated",
        "_dump_pydantic_arguments",
        "__doc__",
        "__module__",
        "__annotations__",
        "__header__",
        "__wrapped__",
        "_decorated_fun",
        "__qualname__",
    }
)


class PlatformTask(celery.Task):
    """Celery task base: ``handler(envelope, tx)`` with idempotency, retries, dead letters."""

    data_model: ClassVar[type[Any]] = dict
    permanent_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    #: the per-key limits its options declared (checked at declaration)
    platform_limits: ClassVar[LimitSpec] = LimitSpec()
    #: the task options this class owns; a subclass adds its own:
    #: ``platform_options = PlatformTask.platform_options | {"channel", "rail"}``
    platform_options: ClassVar[frozenset[str]] = PLATFORM_OPTIONS
    #: the handler takes (envelope, tx) but callers publish one argument: skip Celery's
    #: signature check of the published arguments
    typing = False
    #: expected failures: logged by Celery without a traceback and not captured by
    #: Sentry's CeleryIntegration (the dead-letter alert already reported the job)
    throws: ClassVar[tuple[type[BaseException], ...]] = (DeadLettered,)
    #: the worker-side request: task events carry no result and no raw exception text,
    #: and an attempt killed at the hard time limit is recorded before the requeue
    Request = "platform_tasks.consumer.time_limits:StoppedAttemptRequest"
    #: a hard time limit requeues the message instead of acknowledging it: its redelivery
    #: settles the stopped attempt (retry or dead letter, ``consumer/time_limits.py``)
    acks_on_timeout = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_declaration(cls)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from platform_tasks.consumer.pipeline import pipeline_for

        # the tracer's pushed request, read once: ``self.request`` is a proxy that looks
        # the stack up again on every attribute the pipeline reads
        request = self.request_stack.top
        if request is None:  # called directly, outside a worker: Celery's default request
            request = self.request
        try:
            result = pipeline_for(self.app).process(self, args, kwargs, request)
        except VERDICT_RAISES:
            settled()
            raise
        except Exception as exc:
            # The handler's own errors never get here (the pipeline settles them): this is
            # the platform's code failing before a verdict. Celery would record a failure
            # and acknowledge the message, losing the job unrecorded; it goes back instead.
            raise requeue_unsettled(self.name, request, exc) from exc
        settled()
        return result

    def execute(self, envelope: Any, tx: Any) -> Any:
        """The work of one attempt, inside the transaction that holds the idempotency row.

        The default runs the handler. Subclasses (``NotificationTask``) wrap it: render,
        take rate-limit tokens, send. Raising :class:`~platform_tasks.errors.Throttled`
        reschedules the job without spending an attempt.
        """
        return self.run(envelope, tx)


def check_declaration(cls: type[Any]) -> None:
    """Reject unknown or conflicting options of a task declared with ``base=PlatformTask``."""
    namespace = vars(cls)
    name = namespace.get("name") or cls.__name__
    owned: frozenset[str] = getattr(cls, "platform_options", PLATFORM_OPTIONS)
    if namespace.get("_decorated"):
        for key in namespace:
            if key in _DECORATOR_KEYS or key in owned or key.startswith("__"):
                continue
            if key in CELERY_RETRY_OPTIONS:
                raise ConfigurationError(
                    f"task {name!r}: option {key!r} is not supported on a PlatformTask; retries "
                    "follow the queue's RetryPolicy (create_app(retry_policies=...)) and "
                    "permanent_errors=(...) marks errors that must not be retried"
                )
            if key not in CELERY_ROUTING_OPTIONS and not hasattr(celery.Task, key):
                known = ", ".join(sorted(owned))
                raise ConfigurationError(
                    f"task {name!r}: unknown task option {key!r} (PlatformTask options: {known};"
                    " other options must be Celery task attributes)"
                )
    model = cls.data_model
    if not (model is dict or (isinstance(model, type) and issubclass(model, BaseModel))):
        raise ConfigurationError(
            f"task {name!r}: data_model must be a pydantic model class or dict, got {model!r}"
        )
    cls.platform_limits = limit_spec(cls, name)
    errors = cls.permanent_errors
    if not isinstance(errors, tuple) or not all(
        isinstance(err, type) and issubclass(err, BaseException) for err in errors
    ):
        raise ConfigurationError(
            f"task {name!r}: permanent_errors must be a tuple of exception classes, got {errors!r}"
        )


def platform_tasks_of(app: PlatformCelery) -> list[str]:
    """Names of the app's PlatformTasks that make a worker check its database at start-up.

    A task the platform registered by itself on every app (``start_up_checks = False``:
    the fan-out consumer ``create_app`` adds) does not: an app that never fans out keeps
    starting with the database it had, migrated or not.
    """
    return sorted(
        name
        for name, task in app.tasks.items()
        if isinstance(task, PlatformTask) and getattr(task, "start_up_checks", True)
    )


def own_queues(app: PlatformCelery) -> list[str]:
    """Queues PlatformTasks name with their own ``queue`` option (consumed without ``-Q``)."""
    return sorted(
        {
            task.queue
            for task in app.tasks.values()
            if isinstance(task, PlatformTask) and isinstance(getattr(task, "queue", None), str)
        }
    )


def require_delay_capable_broker(app: PlatformCelery, names: list[str]) -> None:
    """Retries are stored as delays; a broker that cannot hold them would lose every retry.

    Redis brokers hold them in the delay store, RabbitMQ in its native delayed-delivery
    queues (:func:`platform_tasks.brokers.selection.broker_holds_delays`). Any other broker makes
    the worker refuse to start, naming the variable and only the URL's scheme (never its
    password).
    """
    if broker_holds_delays(app.platform_settings):
        return
    scheme = broker_scheme(str(app.conf.broker_url or app.platform_settings.effective_broker_url))
    raise ConfigurationError(
        f"PLATFORM_BROKER_URL: a {scheme or 'unknown'}:// broker cannot hold the delays "
        "that PlatformTask retries are scheduled through; use a redis://, rediss:// or "
        f"amqp:// broker (needed by tasks: {', '.join(names)})"
    )


class RequireDatabaseStep(bootsteps.Step):
    """Worker bootstep: refuse to start PlatformTask consumers without a database or a
    broker that can hold delays."""

    label = "platform database check"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        app = worker.app
        app.loader.import_default_modules()
        names = platform_tasks_of(app)
        if names:
            try:
                require_database_url(app.platform_settings)
            except ConfigurationError as exc:
                raise ConfigurationError(f"{exc} (needed by tasks: {', '.join(names)})") from None
            require_delay_capable_broker(app, names)


def install(app: PlatformCelery) -> None:
    """Refuse to start a worker whose PlatformTasks cannot work; consume their own queues."""
    app.steps["worker"].add(RequireDatabaseStep)
    add_queue_source(app, own_queues)
